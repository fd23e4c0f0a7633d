"""Provisioning: the Ansible playbook run, its secrets, and the checks before it."""
