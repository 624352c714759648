"""What is graded: the stage specs (specs/*.toml) and each stage's checks."""
