"""The math reasoning study (DESIGN.md section 5): problems (data, generated), prompts, and the math-verify reward."""
