"""The recompute GPT-2 the grader trusts, and the weights it reads."""
