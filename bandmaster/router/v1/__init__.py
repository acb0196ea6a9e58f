"""Generated from proto/ by scripts/gen_protos.py. Do not edit."""
