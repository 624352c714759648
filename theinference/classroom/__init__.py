"""The instructor's side: grade a class, join shards, build a Gradescope autograder, and report
what the class gets wrong. Each submission is graded by `theinference test` in a process of its
own, so class grading can never disagree with what a student sees."""
