"""The math reasoning study (docs/design.md section 5): problems (data, generated), prompts, the math-verify
reward."""
