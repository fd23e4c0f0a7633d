"""Triton kernels for DeepSeek-V4 decode on sm_120, each with a plain torch reference."""
