"""Many runs and remote runs: Ray Tune sweeps and Ray Jobs submission."""
