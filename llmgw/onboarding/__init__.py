"""Bringing machines into llmgw: a Proxmox VM from a cloud image (provision), a host over ssh (onboard).

    llmgw-provision-node  llmgw.cmd.provision:main   (proxmox.py: the qm/pvesh plan)
    llmgw-onboard-node    llmgw.cmd.onboard:main     (onboard.py: its steps; identity.py, ssh.py, remote_install.py)
    artifact.py           recognises a release artifact (hack/release.sh) and the hosts it runs on
"""
