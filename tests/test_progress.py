import io

from capacity.util.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_counted_phase_prints_each_tenth_and_its_end_once():
    log = io.StringIO()
    p = Progress("plan", stream=log)
    for i in range(304):
        p.update("analytic bracket", i + 1, 304)
    p.update("confirming MI355X TP1 x 2 replicas")
    p.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0] == "plan: analytic bracket 1/304"
    assert lines[-2] == "plan: analytic bracket 304/304"
    assert lines[-1] == "plan: confirming MI355X TP1 x 2 replicas"
    assert len(lines) == 1 + 9 + 1 + 1          # first, tenths 1-9, the end, the uncounted message


def test_on_a_terminal_the_line_is_rewritten_and_closed():
    tty = Terminal()
    p = Progress("validate", stream=tty)
    for i in range(3):
        p.update("rows", i + 1, 3)
    p.close()
    out = tty.getvalue()
    assert out.count("\r") == 3 and out.endswith("validate: rows 3/3\033[K\n")


def test_disabled_progress_prints_nothing():
    log = io.StringIO()
    p = Progress("calibrate", enabled=False, stream=log)
    p.update("simulated rows", 1, 2)
    p.close()
    assert log.getvalue() == ""
