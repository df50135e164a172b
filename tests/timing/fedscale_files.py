"""Small traces in FedScale's layout (benchmark/dataset/data/device_info/README.md):
pickled dicts keyed by integer client id. The first entries are in the style of published
ones. Shared by the converter's tests and the `fedray traces` command's."""

from __future__ import annotations

import pathlib
import pickle

DEVICES = {1: {"computation": 162.0, "communication": 5648.109619499134},
           2: {"computation": 40.0, "communication": 8.0},
           3: {"computation": 20.5, "communication": 1024.0}}
BEHAVE = {
    3834: {"duration": 211625, "finish_time": 518400, "model": "CPH1801",
           "active": [12788, 100044, 188992, 271372, 276663, 352625, 356267, 441193],
           "inactive": [65881, 133574, 208292, 276575, 295006, 356236, 400906, 475099]},
    17: {"duration": 50, "inactive": [40, 100], "finish_time": 100, "active": [10, 80],
         "model": "SM-G960F"},
    5: {"duration": 0, "inactive": [], "finish_time": 50, "active": [], "model": "Pixel 3"},
}


def write_pickle(path: pathlib.Path, obj) -> str:
    path.write_bytes(pickle.dumps(obj))
    return str(path)
