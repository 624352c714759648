"""One grading run: cases in order, the student's answers judged against the oracle's, the stage's
diagnosis, results built once and complete."""
