"""The shared core: inventory, SSH, exit codes, paths, unit files, the CLI plumbing. Imports no capability."""
