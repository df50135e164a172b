"""Local training: the sequential kernel (one client on the replica) and the
vectorized one (a group of clients in one batched step). No Ray."""
