"""The student's course directory: opening and making one, its settings, its language, and the
templates `init` copies."""
