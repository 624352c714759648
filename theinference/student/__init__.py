"""The student's process: started, sandboxed, limited, timed and asked from outside; the worker
that runs inside it imports nothing of the grader."""
