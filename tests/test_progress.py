import io

from fedray.progress import Progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _m(r, **kw):
    return {"round": r, "updates_per_s": 12.5, "train_loss": 1.25, "elapsed_s": 3.0, **kw}


def test_terminal_shows_one_live_line_with_accuracy():
    out = _Tty()
    p = Progress(4, stream=out)
    p(_m(1))
    p(_m(2, test_accuracy=0.5))
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "round 2/4" in text and "acc 0.500" in text and "12.5 client updates/s" in text


def test_logs_get_sparse_lines():
    out = io.StringIO()
    p = Progress(100, stream=out)
    for r in range(1, 101):
        p(_m(r, **({"test_accuracy": 0.1} if r % 50 == 0 else {})))
    lines = out.getvalue().splitlines()
    assert len(lines) == 20 and "\r" not in out.getvalue()
