"""Validation on a box (``validate --gpu``) and here (``--local``), over the harness in ``dsv4kit.validation``."""
