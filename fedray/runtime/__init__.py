"""The only package that uses Ray: the driver, the workers, the pool, the typed
messages between them, the Ray session and its reaper, the in-process backend."""
