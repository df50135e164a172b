import io

from fedray.tracking.progress import Progress


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


def test_a_callback_that_ends_its_line_with_the_run():
    from fedray.tracking.callbacks import Callback

    out = _Tty()
    p = Progress(2, stream=out)
    assert isinstance(p, Callback)
    p.on_round_end(1, _m(1), None)
    p.on_run_failed(KeyboardInterrupt())  # the error goes on a line of its own
    assert out.getvalue().startswith("\rround 1/2") and out.getvalue().endswith("\n")
    out = _Tty()
    p = Progress(2, stream=out)
    p.on_round_end(2, _m(2, test_accuracy=0.75), None)
    p.on_run_end({})
    assert "acc 0.750" in out.getvalue() and out.getvalue().endswith("\n")
