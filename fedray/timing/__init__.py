"""Simulated time: device profiles, availability, update durations, round arithmetic, traces.

Pure functions of (seed, traces, parameters), with no Ray and no torch, so the schedule of
a run can be computed, tested and checkpointed on its own (docs/time.md):

- ``devices``: a client's compute cost and bandwidths (log-normal model or trace);
- ``availability``: when a client is online (always, diurnal, or trace);
- ``clock``: one update's simulated duration, and how a synchronous round ends;
- ``online_sampling``: k distinct online clients in O(k / online share) draws;
- ``traces``: fedray's CSV/Arrow trace files, their checks, and seeded generators;
- ``fedscale``: FedScale's pickled traces, read without running code, converted;
- ``streams``: the counter-based random streams, vectorised over client ids;
- ``rounds``: a synchronous run's rounds on the clock (what the driver asks with
  ``clock.enabled``);
- ``trace_commands``: ``fedray traces generate / convert-fedscale / describe``.
"""
