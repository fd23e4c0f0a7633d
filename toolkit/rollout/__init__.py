"""The kernel rollout into SGLang: the plugin, its targets, the auto-flag plan, the status report. Standard library only at import."""
