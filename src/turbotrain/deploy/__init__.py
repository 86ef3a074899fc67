"""Deploy stage: quantize, script, verify and report a trained run (see export.py)."""
