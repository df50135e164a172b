"""Algorithm names a job can choose, and the client/aggregator/server parts each one uses.

FedAvg (McMahan et al.): clients run local SGD from the global model; the server averages
their model deltas weighted by example count and applies them with a server learning rate:
    x <- x + server.lr * sum_k (n_k / sum_j n_j) * (y_k - x).
"""

from __future__ import annotations

ALGORITHMS: dict[str, str] = {
    "fedavg": "local SGD on each client, example-weighted mean of deltas, server SGD",
}
