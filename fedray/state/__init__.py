"""What a run keeps on disk: the run directory, checkpoints, the versioned client
state store, storage checks, credential masking."""
