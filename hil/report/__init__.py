"""Reports of a run: ``junit.xml`` (one test case per expectation), ``results.json``
(every figure) and ``report.html`` (one self-contained page with inline SVG plots)."""

from hil.report.write import write_reports

__all__ = ["write_reports"]
