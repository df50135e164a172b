"""Pure building blocks of a round: the flat model, seeding, sampling, assignment,
losses, evaluation sums and the model zoo. No Ray."""
