"""The composition roots: commands that assemble the application's parts.

The framework (``llmgw.runtime``) knows no controller; the command here picks
the controllers and hands them to it.
"""
