"""The result of partitioning a data set into federated clients.

A partitioner maps a Dataset to a Partition: for every client, the indices of its train
examples (and, where the partitioner gives clients their own test data, of its test
examples). A partition never copies pixels; the store writer gathers them once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Partition:
    client_names: list[str]  # stable, unique client ids ("0".."499", or writer ids)
    train: list[np.ndarray]  # per client: int64 indices into dataset.train
    test: list[np.ndarray] | None = None  # per client: indices into dataset.test; None keeps
    #                                       dataset.test as one central test set
    train_labels: list[np.ndarray] | None = None  # per client: labels replacing
    #                                               dataset.train.y[train[k]] (label flips)
    info: dict = field(default_factory=dict)  # partitioner facts for the manifest (JSON-safe)

    def __post_init__(self) -> None:
        n = len(self.client_names)
        if len(set(self.client_names)) != n:
            raise ValueError("client names must be unique")
        if len(self.train) != n or (self.test is not None and len(self.test) != n):
            raise ValueError("one index array per client and split")
        if self.train_labels is not None and [len(a) for a in self.train_labels] != \
                [len(a) for a in self.train]:
            raise ValueError("train_labels must match train indices client by client")

    @property
    def num_clients(self) -> int:
        return len(self.client_names)
