"""The %lms_tune widget: sliders with instant predictions, Measure, Autotune, Stop, Apply, Frontier.

Slider moves call only the prediction (a memoised liveness replay) and redraw;
Measure runs one trial; Autotune runs the search one trial per turn of the
kernel's event loop, so Stop is heard between trials. Core ipywidgets and a
plain plotly Figure in an Output, as in the %%lms_fit dashboard.
"""

from __future__ import annotations

import asyncio
import html
import math
import time

from ..lms.core.autotune import PatternSearch, Setting, Trial
from .report_html import html_table
from .plots import figure_bundle
from ..units import MIB


def _batch_choices(batch_size: int) -> list[int]:
    choices = {batch_size} | {max(1, int(batch_size * 2**k)) for k in range(-3, 4)}  # whole batches
    return sorted(choices)


class Tuner:
    """Widgets around a :class:`lms_magic.tuning.session.TuningSession`.

    ``controls`` holds the sliders by knob name and ``buttons`` the buttons;
    ``estimate`` is the prediction for the current slider values,
    ``response_s`` how long the last slider move took to predict, and
    ``redraw_s`` how long to predict and redraw everything (figures included).
    ``on_apply(n_tensors, lb)`` is called by Apply (``%lms_tune`` passes
    ``%%lms_fit``'s ``apply_defaults``).

    Its state is mostly widgets: the sliders, toggles, buttons, figures and status lines a notebook shows, each
    an attribute the callbacks and the tests read; the rest is the session and the last estimate and timings.
    """

    def __init__(self, session, max_trials: int = 12, on_apply=None):
        import ipywidgets as widgets

        self.session, self.max_trials, self.on_apply = session, max_trials, on_apply
        self.search: PatternSearch | None = None
        self.stop_requested = False
        self.applied: str | None = None
        self.response_s = 0.0
        batch = session.batch_size
        candidates = session.predictor.predict(-1, 1, batch).candidates
        start = session.start(batch) if session.budget_bytes else Setting(candidates, 1, batch)
        unbudgeted = session.estimate(Setting(0, 1, batch)).peak_bytes_without_lms
        budget_mib = (session.budget_bytes or unbudgeted) / MIB
        style = {"description_width": "110px"}
        layout = widgets.Layout(width="460px")
        self.controls = {
            "n_tensors": widgets.IntSlider(start.n_tensors, 0, max(candidates, 1), description="n_tensors",
                                           style=style, layout=layout, continuous_update=True),
            "lb": widgets.IntSlider(1, 1, 8, description="lb", style=style, layout=layout),
            "batch_size": widgets.SelectionSlider(options=_batch_choices(batch), value=batch,
                                                  description="batch size", style=style, layout=layout),
            "budget_mib": widgets.FloatSlider(round(budget_mib, 1),
                                              min=math.ceil(session.persistent_bytes / MIB * 10) / 10,
                                              max=round(max(budget_mib, unbudgeted / MIB) * 1.5, 1) + 1, step=0.1,
                                              description="budget (MiB)", style=style, layout=layout),
        }
        self.toggles = {  # the session's options: predictions, trials and the LMS(...) call follow them
            "lean_ops": widgets.Checkbox(session.lms_options["lean_ops"], description="lean_ops"),
            "order_backward": widgets.Checkbox(session.lms_options["order_backward"], description="order_backward"),
            # recompute="only": n_tensors counts the tensors recomputed, and nothing crosses the host link
            "recompute": widgets.Checkbox(session.lms_options["recompute"] == "only", description="recompute only"),
        }
        for toggle in self.toggles.values():
            toggle.observe(self._on_toggle, names="value")
        self.buttons = {name: widgets.Button(description=name)
                        for name in ("Measure", "Autotune", "Stop", "Apply", "Frontier")}
        self.buttons["Stop"].disabled = True
        self.prediction_html = widgets.HTML()
        self.makeup_output = widgets.Output()
        self.top_html = widgets.HTML()
        self.status = widgets.HTML()
        self.trials_html = widgets.HTML()
        self.figure_output = widgets.Output()
        self.frontier_output = widgets.Output()
        self.frontier = self.frontier_figure = None  # the last Frontier's FitExplanation and its figure
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.buttons["Measure"].on_click(lambda _: self.measure())
        self.buttons["Autotune"].on_click(lambda _: self.start_autotune())
        self.buttons["Stop"].on_click(lambda _: self.request_stop())
        self.buttons["Apply"].on_click(lambda _: self.apply())
        self.buttons["Frontier"].on_click(lambda _: self.show_frontier())
        note = "" if session.runner.gpu else (
            "<br><b>No GPU:</b> measured trials train on the CPU, so their times are not GPU times.")
        if not session.runner.measures_peak:
            note += f"<br>Trials' peaks: {html.escape(session.runner.peak_source)}."
        for name, why in getattr(session, "unavailable", {}).items():  # a knob this backend does not take
            widget = self.controls.get(name) or self.toggles.get(name)
            if widget is not None:
                widget.disabled = True
                setattr(widget, "tooltip" if widget.has_trait("tooltip") else "description_tooltip", f"{name}: {why}")
        self.header = widgets.HTML(f"<b>%lms_tune</b>: {candidates} candidate "
                                   f"tensors; weights and optimizer state {session.persistent_bytes / MIB:.1f} MiB; "
                                   f"link {session.bandwidth.slowest / 1e9:.1f} GB/s "
                                   f"({html.escape(session.bandwidth.source)}){note}")
        self.widget = widgets.VBox([
            self.header,
            widgets.HBox([widgets.VBox(list(self.controls.values()) + [widgets.HBox(list(self.toggles.values()))]),
                          self.prediction_html]),
            widgets.HBox(list(self.buttons.values())), self.status,
            widgets.HBox([self.figure_output, self.makeup_output]), self.top_html, self.trials_html,
            self.frontier_output,
        ])
        self.refresh()

    # -- predictions -------------------------------------------------------------------------
    def setting(self) -> Setting:
        values = {name: control.value for name, control in self.controls.items()}
        return Setting(values["n_tensors"], values["lb"], values["batch_size"])

    def _on_change(self, change) -> None:
        owner = change["owner"]
        if owner is self.controls["budget_mib"]:
            try:
                self.session.set_budget(int(change["new"] * MIB))
            except ValueError as error:
                self.status.value = f"<b>{html.escape(str(error))}</b>"
        elif owner is not self.controls["n_tensors"]:
            count = self.session.predictor.predict(-1, self.controls["lb"].value,
                                                   self.controls["batch_size"].value).candidates
            self.controls["n_tensors"].max = max(count, 1)
        self.refresh()

    def _on_toggle(self, change) -> None:
        """A new ``lean_ops`` / ``order_backward`` / ``recompute``: the step traced again the first time (said
        while it runs)."""
        self.status.value = "tracing the step with the new options..."
        self.session.set_options(**self.toggled())
        count = self.session.predictor.predict(-1, self.controls["lb"].value, self.controls["batch_size"].value)
        self.controls["n_tensors"].max = max(count.candidates, 1)
        self.status.value = ""
        self.refresh()

    def toggled(self) -> dict:
        """The toggles as LMS options: ``lean_ops``, ``order_backward`` (True or False), ``recompute`` ("only"
        or False)."""
        values = {name: toggle.value for name, toggle in self.toggles.items()}
        values["recompute"] = "only" if values["recompute"] else False
        return values

    def refresh(self) -> None:
        """Predicts for the sliders' values and redraws (nothing is trained)."""
        started = time.perf_counter()
        self.estimate = self.session.estimate(self.setting())
        self.response_s = time.perf_counter() - started
        self.prediction_html.value = self._prediction_text()
        self._draw()
        self.redraw_s = time.perf_counter() - started

    def _prediction_text(self) -> str:
        e, budget = self.estimate, self.session.budget_bytes
        verdict = "" if e.fits is None else ("fits the budget" if e.fits else "<b>over the budget</b>")
        compute = "measure to know" if e.compute_s is None else f"{e.compute_s * 1e3:.1f} ms"
        recompute = self.session.lms_options["recompute"] == "only"
        return (f"<table><tr><td>predicted peak</td><td><b>{e.peak_bytes / MIB:.1f} MiB</b> {verdict}</td></tr>"
                f"<tr><td>without LMS</td><td>{e.peak_bytes_without_lms / MIB:.1f} MiB</td></tr>"
                f"<tr><td>budget</td><td>{'none' if budget is None else f'{budget / MIB:.1f} MiB'}</td></tr>"
                + (f"<tr><td>recomputed</td><td>{e.swapped_tensors} of {e.candidates} tensors that can be, "
                   f"{self._recomputed_bytes() / MIB:.1f} MiB per step, nothing over the host link (their compute "
                   "time is not predicted: Measure)</td></tr>" if recompute else
                   f"<tr><td>swapped</td><td>{e.swapped_tensors} of {e.candidates} tensors, "
                   f"{e.swapped_bytes_per_step / MIB:.1f} MiB out and back per step</td></tr>"
                   f"<tr><td>copy time</td><td>{e.transfer_s * 1e3:.1f} ms</td></tr>")
                + f"<tr><td>compute</td><td>{compute}</td></tr>"
                + ("" if recompute else f"<tr><td>step time &ge;</td><td>{e.lower_bound_s * 1e3:.1f} ms</td></tr>")
                + ("" if e.step_ratio is None or recompute else
                   f"<tr><td>predicted step time</td><td><b>{e.step_ratio - 1:+.0%}</b> "
                   f"(compute {e.compute_source})</td></tr>")
                + (f"<tr><td>device</td><td>{html.escape(e.measured)}</td></tr>" if e.measured else "")
                + "</table>")

    def _recomputed_bytes(self) -> int:
        setting = self.setting()
        return self.session.predictor.predict(setting.n_tensors, setting.lb,
                                              setting.batch_size).recomputed_bytes_per_step

    def _draw_makeup(self) -> None:
        """The predicted peak's make-up, without LMS and with the sliders' setting, and its largest tensors."""
        import plotly.graph_objects as go

        from ..lms.core.peak import KINDS

        setting, predictor = self.setting(), self.session.predictor
        peaks = {"without LMS": predictor.explain(0, setting.lb, setting.batch_size),
                 "with LMS": predictor.explain(setting.n_tensors, setting.lb, setting.batch_size)}
        figure = go.Figure([go.Bar(name=kind.replace("_", " "), x=list(peaks),
                                   y=[peak["by_kind"].get(kind, 0) / MIB for peak in peaks.values()]) for kind in KINDS])
        if self.estimate.measured:  # what the measured steps say the allocator holds beyond the replay's tensors
            predicted = (self.estimate.peak_bytes_without_lms, self.estimate.peak_bytes)
            figure.add_trace(go.Bar(name="allocator beyond the replay (measured)", x=list(peaks), y=[
                (bytes_ - sum(peak["by_kind"].values())) / MIB for bytes_, peak in zip(predicted, peaks.values())]))
        figure.update_layout(title="what fills the predicted peak (MiB)", barmode="relative", height=340, width=420,
                             margin=dict(l=50, r=20, t=40, b=40))
        self.makeup_figure, self.peaks = figure, peaks
        self.makeup_output.outputs = ({"output_type": "display_data", "data": figure_bundle(figure),
                                       "metadata": {}},)
        peak = peaks["with LMS"]
        rows = [[row["layer"], "?" if row["shape"] is None else "x".join(map(str, row["shape"])),
                 f"{row['bytes'] / MIB:.1f}", row["kind"].replace("_", " ")] for row in peak["top"]]
        self.top_html.value = (f"<b>at the peak</b> ({peak['phase']} pass, after {html.escape(peak['op'] or '?')}), "
                               "the largest tensors:" + html_table(["layer", "shape", "MiB", "kind"], rows))

    def _draw(self) -> None:
        import plotly.graph_objects as go

        self._draw_makeup()

        figure = go.Figure()
        e = self.estimate
        figure.add_trace(go.Scatter(x=[e.lower_bound_s * 1e3], y=[e.peak_bytes / MIB], mode="markers",
                                    marker=dict(symbol="diamond-open", size=14), name="prediction (time: lower bound)"))
        measured = [t for t in self.session.trials if t.step_s is not None and t.peak_bytes is not None]
        if measured:
            figure.add_trace(go.Scatter(
                x=[t.step_s * 1e3 for t in measured], y=[t.peak_bytes / MIB for t in measured], mode="markers",
                name="measured", text=[f"n_tensors={t.setting.n_tensors} lb={t.setting.lb} "
                                       f"batch={t.setting.batch_size}" for t in measured]))
        if self.session.budget_bytes is not None:
            figure.add_hline(y=self.session.budget_bytes / MIB, line_dash="dash", annotation_text="budget")
        figure.update_layout(title="peak memory against time per step", xaxis_title="ms per step",
                             yaxis_title="device peak (MiB)", height=340, margin=dict(l=50, r=20, t=40, b=40))
        self.figure = figure
        self.figure_output.outputs = ({"output_type": "display_data", "data": figure_bundle(figure),
                                       "metadata": {}},)

    # -- trials ------------------------------------------------------------------------------
    def _show_trials(self) -> None:
        rows = [t.row() for t in self.session.trials]
        if not rows:
            return
        self.trials_html.value = html_table(list(rows[0]), [list(row.values()) for row in rows], left_columns=())

    def _after_trial(self, trial: Trial) -> None:
        self._show_trials()
        self.refresh()
        self.status.value = f"trial: {html.escape(str(trial.row()))}"

    def measure(self) -> Trial | None:
        """Runs one trial with the sliders' setting (the model ends as it started)."""
        self.status.value = f"measuring {self.setting()} ..."
        trial = self.session.measure(self.setting())
        self._after_trial(trial)
        return trial

    def start_autotune(self):
        """Starts autotune: a task on the kernel's event loop, or at once outside a kernel."""
        from ..lms.core.plan import BudgetError

        try:
            self.search = self.session.search(self.max_trials, self.controls["batch_size"].value,
                                              self.controls["lb"].value)
        except BudgetError as error:
            self.status.value = f"<b>{html.escape(str(error))}</b>: nothing ran"
            return None
        self.stop_requested = False
        self._set_running(True)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            while self._autotune_turn():
                pass
            return None
        return loop.create_task(self._autotune_async())

    async def _autotune_async(self) -> None:
        while self._autotune_turn():
            await asyncio.sleep(0.05)  # the kernel handles the Stop button's click here

    def _autotune_turn(self) -> bool:
        """Runs the next trial; False when the search is over."""
        if self.stop_requested:
            self.search.stop("user")
        setting = self.search.next_setting()
        if setting is None:
            self._finish_autotune()
            return False
        self.status.value = f"autotune: measuring {setting} ..."
        try:
            trial = self.search.record(self.session.measure(setting))
        except BaseException:
            self._set_running(False)
            raise
        self._after_trial(trial)
        return True

    def _finish_autotune(self) -> None:
        self._set_running(False)
        result = self.search.result()
        if result.best is None:
            self.status.value = f"autotune: nothing fits ({result.stopped_by})"
            return
        best = result.best.setting
        for name in ("lb", "batch_size", "n_tensors"):
            self.controls[name].value = getattr(best, name)
        self.status.value = (f"autotune: best {best} at {result.best.step_s * 1e3:.1f} ms per step after "
                             f"{result.measured_trials} trials ({result.stopped_by}); press Apply to use it")

    def request_stop(self) -> None:
        self.stop_requested = True

    def _set_running(self, running: bool) -> None:
        for name, button in self.buttons.items():
            button.disabled = running != (name == "Stop")

    def apply(self) -> str:
        """Makes the sliders' setting the default of the next %%lms_fit; returns the LMS(...) call."""
        setting = self.setting()
        toggles = self.toggled()
        if self.on_apply is not None:
            self.on_apply(setting.n_tensors, setting.lb, **toggles)
        self.applied = self.session.lms_call(setting)
        chosen = "".join(f", {name}={on!r}" for name, on in toggles.items() if on)
        self.status.value = (f"applied: the next %%lms_fit uses n_tensors={setting.n_tensors}, lb={setting.lb}{chosen}. "
                             f"In a script: <code>{html.escape(self.applied)}</code>")
        print(self.applied)
        return self.applied

    def show_frontier(self):
        """The frontier (``explain_fit``): predicted peak by batch size, without LMS and with its plan, at the batch
        slider's sizes, against the budget; a plan search per size, so it waits for the button."""
        from ..sizing.explain_fit import explain_fit
        from .plots import display_figure, frontier_figure

        session = self.session
        budget = self.controls["budget_mib"].value * MIB
        self.status.value = "frontier: tracing the step and predicting each batch size..."
        self.frontier = explain_fit(  # every way against the budget
            session.runner.model, session.runner.data, batch_size=session.batch_size,
            budget=budget, modes=("without LMS", "LMS"),
            batch_sizes=self.controls["batch_size"].options, min_bytes=session.lms_options["min_bytes"],
            device=session.lms_options["device"], host_device=session.lms_options["host_device"], confirm=False)
        best = self.frontier.largest_at_speed()
        self.status.value = ("frontier: " + (f"the largest batch at 90% of plain speed within the budget: "
                                              f"{best.batch_size} ({best.mode})" if best else "no batch fits the budget"))
        self.frontier_figure = frontier_figure(self.frontier)
        self.frontier_output.clear_output()
        with self.frontier_output:
            display_figure(self.frontier_figure)
        return self.frontier

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
