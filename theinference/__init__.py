"""theinference: a grader for a course on KV-cached GPT-2 inference."""

__version__ = "0.1.0"
