"""The report as one self-contained HTML page (its figures inlined): what a browser
pointed at a run directory shows, during the run (a live run rewrites it) and after."""

from __future__ import annotations

import base64
import contextlib
import html
import json
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from dione.report.dashboards import Dashboard

__all__ = ["LiveReport", "write_page"]


def _image(path: Path, alt: str) -> str:
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _inline(text: str) -> str:
    """One line of the summary as HTML: escaped, its `code` spans and **bold** marked."""
    import re

    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", escaped)


def _files(folder: Path) -> str:
    """Links to the report's own files (every slice, every step's loss, every
    evaluation)."""
    names = [("timeline.csv", "every slice"), ("metrics.csv", "every step's loss and time"),
             ("evaluations.csv", "every evaluation, with its step"),
             ("summary.csv", "per task"), ("summary.md", "this summary"),
             ("gantt.png", "the Gantt chart"), ("curves.png", "the learning curves")]
    return ", ".join(f'<a href="{name}">{name}</a> ({what})' for name, what in names
                     if (folder / name).is_file()) or "none yet"


def _markdown_tables(text: str) -> str:
    """The summary's Markdown as HTML: headings, tables, lists and paragraphs (all it
    holds)."""
    out: list[str] = []
    table: list[list[str]] = []
    items: list[str] = []

    def flush() -> None:
        if table:
            head, *rows = table
            out.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                                 for row in rows) + "</table>")
            table.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            if items:
                flush()
            # Split at the pipes that part cells, not the escaped ones ("\\|") a cell holds.
            cells = [_inline(c.strip().replace("\\|", "|"))
                     for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
            if not all(set(c) <= {"-", ":", " "} for c in cells):
                table.append(cells)
            continue
        if line.startswith("- "):
            if table:
                flush()
            items.append(_inline(line[2:]))
            continue
        flush()
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 3)
            out.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


def _written(refresh_seconds: int | None, now: float, run_dir: Path) -> str:
    """When the page was written; on a live run's page, a script that reloads it and,
    once it has not been rewritten for three of its periods and a minute (a live run
    rewrites it at least every period), says the run's launcher may be gone (a page
    left by a killed run said "running" for ever)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now))
    if not refresh_seconds:
        return f'<p class="written">Written {stamp}.</p>'
    stale = 3 * refresh_seconds + 60
    from dione.state.store import how_to_continue

    rest = (" min: the run's launcher may be gone (killed, or its machine lost), and what "
            f"it shows as running is not. `dione status {run_dir}` says; "
            f"{how_to_continue(run_dir)} continues it.")
    said = json.dumps(rest).replace("</", "<\\/")  # a string in the script
    return f"""<p class="written" id="written">Written {stamp}; rewritten at least every \
{refresh_seconds} s while the run's launcher lives.</p>
<p id="stale" style="display:none; background:#fdd; padding:0.5em"></p>
<script>
(function () {{
  const late = Date.now() / 1000 - {now:.0f};
  if (late > {stale}) {{
    const note = document.getElementById("stale");
    note.textContent = "This page has not been rewritten for " + Math.round(late / 60) +
      {said};
    note.style.display = "block";
  }}
  setTimeout(function () {{ location.reload(); }}, {refresh_seconds * 1000});
}})();
</script>"""


def write_page(folder: Path, refresh_seconds: int | None = None) -> Path:
    """``folder/index.html`` from the summary and figures written there, saying when it
    was written; with ``refresh_seconds``, the browser reloads it (a live run rewrites
    it) and says when it has gone stale."""
    summary = (folder / "summary.md").read_text() if (folder / "summary.md").is_file() else ""
    # Without scripts a browser still reloads a live page (it cannot say it is stale).
    refresh = (f'<noscript><meta http-equiv="refresh" content="{refresh_seconds}">'
               "</noscript>" if refresh_seconds else "")
    # The summary's own title: "dione run report: SIMULATED" where nothing trained.
    heading = next((line.lstrip("#").strip() for line in summary.splitlines()
                    if line.startswith("# ")), "dione run report")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8">{refresh}<title>{html.escape(heading)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1200px; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #bbb; padding: 0.2em 0.6em; text-align: left; }}
th {{ background: #eee; }}
img {{ max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }}
.written {{ color: #666; font-size: 0.85em; }}
</style></head><body>
{_written(refresh_seconds, time.time(), folder.parent)}
{_markdown_tables(summary)}
<p>Beside this page: {_files(folder)}</p>
<h2>Plan and reality</h2>
{_image(folder / "gantt.png", "Gantt chart: the first adopted plan and the actual slices")}
<h2>Learning curves</h2>
{_image(folder / "curves.png", "learning curves")}
</body></html>
"""
    path = folder / "index.html"
    path.write_text(page)
    return path


def _yield_to_training() -> None:
    """Put the calling thread (and the threads it starts: TensorBoard's writers) at the
    lowest CPU priority (nice 19): where the gangs use every core (a small machine),
    their steps come first and the figures are written in the moments a core is free.
    Linux only, where a thread's nice value is its own (elsewhere the call would lower
    the whole launcher, or another process). The price: while it holds the GIL and
    waits for a core, the launcher's loop waits for it too (the workers, processes of
    their own, never do)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):  # not allowed here: it keeps its priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class LiveReport:
    """Keeps a live run's report (and its page) fresh: ``touch()`` after something
    changed; a thread of its own rewrites it at most every ``every`` seconds, so the
    run's loop never waits for a figure."""

    def __init__(self, run_dir: Path, every: float = 30.0,
                 boards: Sequence[Dashboard] = ()) -> None:
        """``boards``: dashboards (TensorBoard, MLflow) to bring up to date with the
        report, and to close, with the tasks' results, when the run ends."""
        self.run_dir = run_dir
        self.every = every
        self.boards = list(boards)
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dione-live-report",
                                        daemon=True)
        self._thread.start()

    def touch(self) -> None:
        self._changed.set()

    def _loop(self) -> None:
        from dione.report.files import MetricsWritten, write_report

        _yield_to_training()
        written = MetricsWritten()  # metrics.csv's rows, appended to as steps come
        folder: Path | None = None
        full_after = 0.0  # when the next whole report may be written
        # The first write comes soon after the first change (the plan): a page to open,
        # and a report a run killed in its first half minute leaves; then every `every`.
        pause = min(self.every, 2.0)
        while not self._stop.wait(pause):
            if folder is not None:  # written once: then every `every`
                pause = self.every
            if not self._changed.is_set() or time.monotonic() < full_after:
                if folder is not None:  # nothing new (a long slice), or a whole report
                    # too soon: a fresh stamp, every `every`, so a stale page is a dead run
                    with contextlib.suppress(Exception):
                        write_page(folder, refresh_seconds=max(1, round(self.every)))
                continue
            self._changed.clear()
            began = time.monotonic()
            try:
                for board in self.boards:
                    board.update()
                folder = write_report(self.run_dir, written=written)
                write_page(folder, refresh_seconds=max(1, round(self.every)))
            except Exception:  # a live view must never stop the run
                pass  # the next change tries again; the final report says what failed
            # At most a tenth of one core, however large the run grows: the launcher's
            # core is the gangs' on a small machine (the page's stamp is not held back).
            full_after = began + max(self.every, 10 * (time.monotonic() - began))
        # (A change not yet written when the run ends: the final report writes it.)

    def close(self) -> list[str]:
        """Stop; close each dashboard (with the tasks' results). What failed, one
        sentence each: a dashboard that fails loses nothing of the run."""
        self._stop.set()
        self._thread.join(timeout=300)
        if self._thread.is_alive():  # a dashboard's update hangs: closing it would race
            return [f"the live report's last update did not end in 300 s; "
                    f"{', '.join(type(b).__name__ for b in self.boards) or 'no dashboard'} "
                    "left unclosed: `dione report RUN_DIR --tensorboard/--mlflow` writes "
                    "them from the run's store"]
        failed = []
        for board in self.boards:
            try:
                board.close()
            except Exception as err:
                failed.append(f"{type(board).__name__} could not be written: "
                              f"{type(err).__name__}: {err}")
        return failed
