"""The module SGLang's plugin loader imports: entry point ``dsv4kit = dsv4kit.sglang_plugin:register``.

The name is fixed by installed boxes and SGLang's plugin metadata; the plugin itself is
``dsv4kit.rollout.plugin`` (docs/rollout.md).
"""

from dsv4kit.rollout.plugin import register

__all__ = ["register"]
