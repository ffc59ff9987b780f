"""Bringing machines into llmgw: a Proxmox VM from a cloud image (provision), a host over ssh (onboard).

    llmgw-provision-node  llmgw.onboarding.provision:main   (proxmox.py: the qm/pvesh plan)
    llmgw-onboard-node    llmgw.onboarding.onboard:main     (identity.py, ssh.py, remote_install.py)
    artifact.py           recognises a release artifact (hack/release.sh) and the hosts it runs on
"""
