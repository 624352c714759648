"""The terminal's listener: draws a run through report.py as its events arrive (the header
when it starts, the report when it finishes). The run never prints; this is what does."""

from theinference.events import Event, Listener, RunFinished, RunStarted


def renderer(course: str, weights_label: str):
    """A Renderer (session.Renderer) for a course: given a run's trigger, its listener."""

    def for_run(trigger: str) -> Listener:
        return TerminalDrawing(course, weights_label, trigger)

    return for_run


class TerminalDrawing:
    def __init__(self, course: str, weights_label: str, trigger: str):
        from theinference.report import console

        self.out = console()
        self.course, self.weights_label, self.trigger = course, weights_label, trigger

    def __call__(self, event: Event) -> None:
        from theinference import report

        if isinstance(event, RunStarted):
            stages = list(event.stages)
            report.print_header(self.out, self.course, self.weights_label, stages, self.trigger)
        elif isinstance(event, RunFinished) and not event.result.cancelled:
            report.print_run(self.out, event.result)
