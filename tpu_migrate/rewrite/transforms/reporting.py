"""Progress reporting (rules/reporting.toml) copied from the pytorch/xla examples (TPU155-TPU158): `xm.RateTracker`,
`torch_xla.test.test_utils`, prints of the XLA metrics report, optimum.tpu's `xla_logger`.

The helpers of torch_xla and test_utils are plain Python around a rank and a clock; the file
gets a copy of each one it uses (written as in torch_xla 2.9, the rank from the process group
or the launcher's environment), so the calls keep their arguments and what they print.
"""

from __future__ import annotations

import libcst as cst

from tpu_migrate.rewrite.context import StatementContext, parse_expr
from tpu_migrate.rewrite.registry import CALL, REFERENCE, STATEMENT, transform
from tpu_migrate.rewrite.transforms.common import (
    GLOBAL_MASTER,
    bind,
    helper,
    if_block,
    is_xla,
    literal_bool,
)

# torch_xla/core/xla_model.py RateTracker (xu.getenv_as read RATE_TRACKER_SMOOTHING as a float).
RATE_TRACKER = '''class {name}:
    """xm.RateTracker: counts per second since the last `rate()` (smoothed) and since creation."""

    def __init__(self, smooth_factor=None):
        if smooth_factor is None:
            smooth_factor = float({os}.environ.get("RATE_TRACKER_SMOOTHING", 0.4))
        self._smooth_factor = smooth_factor
        self._start_time = {time}.time()
        self._partial_time = self._start_time
        self._partial_count = 0.0
        self._partial_rate = None
        self._count = 0.0

    def add(self, count):
        self._count += count

    def rate(self):
        now = {time}.time()
        delta = now - self._partial_time
        report_rate = 0.0
        if delta > 0:
            report_rate = self._count / delta
            if self._partial_rate is not None:
                report_rate = (1 - self._smooth_factor) * report_rate + self._smooth_factor * self._partial_rate
            self._partial_count += self._count
            self._count = 0.0
            self._partial_time = now
            self._partial_rate = report_rate
        return report_rate

    def global_rate(self):
        delta = {time}.time() - self._start_time
        count = self._partial_count + self._count
        return count / delta if delta > 0 else 0.0
'''

# torch_xla/test/test_utils.py, the same lines; the device is printed as DEVICE/RANK. Docstrings
# stay on one line: the file's own indentation replaces these four spaces.
WRITE_TO_SUMMARY = '''def {name}(summary_writer, global_step=None, dict_to_write=None, write_xla_metrics=False):
    """test_utils.write_to_summary: scalars to a TensorBoard writer (no XLA metrics to write)."""
    if summary_writer is None:
        return
    for k, v in (dict_to_write or {{}}).items():
        summary_writer.add_scalar(k, v, global_step)
'''

GET_SUMMARY_WRITER = '''def {name}(logdir):
    """test_utils.get_summary_writer: a TensorBoard writer for `logdir`, None when it is empty."""
    if logdir:
        from tensorboardX import SummaryWriter  # imported only when a writer is made, as before

        writer = SummaryWriter(log_dir=logdir)
        {write}(writer, 0, dict_to_write={{"TensorboardStartTimestamp": {time}.time()}})
        return writer
'''

CLOSE_SUMMARY_WRITER = '''def {name}(summary_writer):
    """test_utils.close_summary_writer: flush and close a writer (None: nothing)."""
    if summary_writer is not None:
        summary_writer.flush()
        summary_writer.close()
'''

PRINT_TRAINING_UPDATE = '''def {name}(device, step, loss, rate, global_rate, epoch=None, summary_writer=None):
    """test_utils.print_training_update: one line of training progress from this process."""
    update_data = [
        "Training", "Device={{}}/{{}}".format(device, {rank}),
        "Epoch={{}}".format(epoch) if epoch is not None else None,
        "Step={{}}".format(step), "Loss={{:.5f}}".format(loss),
        "Rate={{:.2f}}".format(rate), "GlobalRate={{:.2f}}".format(global_rate),
        "Time={{}}".format({time}.strftime("%H:%M:%S")),
    ]
    print("|", " ".join(item for item in update_data if item), flush=True)
    if summary_writer:
        {write}(summary_writer, dict_to_write={{"examples/sec": rate, "average_examples/sec": global_rate}})
'''

PRINT_TEST_UPDATE = '''def {name}(device, accuracy, epoch=None, step=None):
    """test_utils.print_test_update: one line of test metrics from this process."""
    update_data = [
        "Test", "Device={{}}/{{}}".format(device, {rank}),
        "Step={{}}".format(step) if step is not None else None,
        "Epoch={{}}".format(epoch) if epoch is not None else None,
        "Accuracy={{:.2f}}".format(accuracy) if accuracy is not None else None,
        "Time={{}}".format({time}.strftime("%H:%M:%S")),
    ]
    print("|", " ".join(item for item in update_data if item), flush=True)
'''

TEST_UTILS = "torch_xla.test.test_utils."
# name in torch_xla -> (helper's base name, its template)
HELPERS = {
    "torch_xla.core.xla_model.RateTracker": ("_RateTracker", RATE_TRACKER),
    TEST_UTILS + "write_to_summary": ("_write_to_summary", WRITE_TO_SUMMARY),
    TEST_UTILS + "get_summary_writer": ("_get_summary_writer", GET_SUMMARY_WRITER),
    TEST_UTILS + "close_summary_writer": ("_close_summary_writer", CLOSE_SUMMARY_WRITER),
    TEST_UTILS + "print_training_update": ("_print_training_update", PRINT_TRAINING_UPDATE),
    TEST_UTILS + "print_test_update": ("_print_test_update", PRINT_TEST_UPDATE),
}

# datetime.strftime and time.strftime agree except on these (datetime's own directives).
_DATETIME_ONLY = ("%f", "%z", "%:z", "%Z")


def _helper_name(sc: StatementContext, qualname: str) -> str:
    base, template = HELPERS[qualname]
    if "{write}" in template:  # written first: the helpers that call it come after it
        return helper(sc, base, template, write=_helper_name(sc, TEST_UTILS + "write_to_summary"))
    return helper(sc, base, template)


@transform("helper", form=REFERENCE)
def helper_reference(node, qualname, sc: StatementContext, rule):
    """`test_utils.print_test_update` passed as a value (a step closure): the file's copy."""
    if qualname not in HELPERS:
        sc.needs_manual(rule.code, rule.summary, qualname)
        return node
    sc.fixed(rule.code, qualname)
    return cst.Name(_helper_name(sc, qualname))


@transform("helper", form=CALL)
def helper_call(call, qualname, sc: StatementContext, rule):
    """The call with its arguments, to the file's copy of the helper; `test_utils.now()` inline."""
    if qualname == TEST_UTILS + "now":
        return _now(call, qualname, sc, rule)
    if qualname not in HELPERS:
        sc.needs_manual(rule.code, rule.summary, qualname)
        return call
    if qualname == TEST_UTILS + "write_to_summary" and not _without_xla_metrics(call):
        sc.needs_manual(
            rule.code, "the XLA metrics (write_xla_metrics) are no longer written: TorchTPU has "
            "none; `tpu-migrate diagnose` reports compiles and host syncs", qualname, anchor="write_xla_metrics",
            where=sc.where,
        )
    sc.fixed(rule.code, qualname)
    return call.with_changes(func=cst.Name(_helper_name(sc, qualname)))


def _without_xla_metrics(call: cst.Call) -> bool:
    bound = bind(call, ["summary_writer", "global_step", "dict_to_write", "write_xla_metrics"])
    return bound is not None and literal_bool(bound.get("write_xla_metrics"), False) is False


def _now(call, qualname, sc: StatementContext, rule):
    """`test_utils.now(format='%H:%M:%S')` was `datetime.now().strftime(format)`."""
    bound = bind(call, ["format"])
    fmt = bound.get("format") if bound is not None else None
    if bound is None or (fmt is not None and not (
        isinstance(fmt.value, cst.SimpleString)
        and not any(d in fmt.value.evaluated_value for d in _DATETIME_ONLY)
    )):
        sc.needs_manual(rule.code, "test_utils.now(format): use datetime.datetime.now().strftime(format)", qualname)
        return call
    sc.fixed(rule.code, qualname)
    text = fmt.value.value if fmt is not None else '"%H:%M:%S"'
    return parse_expr(sc.file.import_plan.fill("{time}.strftime") + f"({text})")


# -- prints of the XLA metrics report (TPU157) ------------------------------------------------

METRICS_REPORTS = frozenset({
    "torch_xla.debug.metrics.metrics_report",
    "torch_xla.debug.metrics.short_metrics_report",
    "torch_xla._XLAC._xla_metrics_report",
})
MASTER_PRINT = "torch_xla.core.xla_model.master_print"
_PRINT_KEYWORDS = frozenset({"sep", "end", "file", "flush", "fd", "local"})


@transform("metrics_print", on="statement")
def metrics_print_statement(small: cst.BaseSmallStatement, sc: StatementContext):
    """`print(met.metrics_report())` / `xm.master_print(met.short_metrics_report())`, labels
    (string literals) allowed: a debug print of counters that only torch_xla keeps. Returns []
    (the statement goes), or None to leave it to the other rules."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    call = small.value
    printer = sc.resolve(call.func)
    is_print = printer == MASTER_PRINT or (
        isinstance(call.func, cst.Name) and call.func.value == "print"
        and "print" not in sc.file.analysis.bound_names
    )
    if not is_print:
        return None
    reports = []
    for arg in call.args:
        if arg.star or (arg.keyword is not None and not (
            arg.keyword.value in _PRINT_KEYWORDS and _plain(arg.value, sc)
        )):
            return None
        if arg.keyword is not None:
            continue
        report = sc.resolve(arg.value.func) if isinstance(arg.value, cst.Call) else None
        if report in METRICS_REPORTS and not arg.value.args:
            reports.append(report)
        elif not isinstance(arg.value, (cst.SimpleString, cst.ConcatenatedString)):
            return None
    rule = sc.file.catalog.by_code("TPU157")
    if not reports or not sc.may_fix(rule, reports[0]):
        return None
    # One statement removed, one fix (at its first torch_xla reference), however many
    # reports it printed.
    removed = [MASTER_PRINT, *reports] if printer == MASTER_PRINT else reports
    sc.fixed(rule.code, removed[0], also=removed[1:])
    return []


def _plain(node: cst.BaseExpression, sc: StatementContext) -> bool:
    """A print keyword that can go with the print: a literal or a name (not torch_xla's)."""
    if isinstance(node, (cst.SimpleString, cst.Integer)):
        return True
    if isinstance(node, (cst.Name, cst.Attribute)):
        qualname = sc.resolve(node)
        return qualname is None or not is_xla(qualname)
    return False


# -- optimum.tpu.xla_logger (TPU158) ----------------------------------------------------------

XLA_LOGGER = "optimum.tpu.xla_logger."
LEVELS = ("debug", "info", "warning", "error")


def _logger_parts(call, qualname, sc: StatementContext, rule):
    """(rank-0 condition, `loguru.logger.LEVEL(message)`), or None after a manual finding.
    xla_logger logged through loguru's logger on global ordinal 0 (`opt(depth=1)`: the caller's
    line, which is the line of the new call)."""
    level = qualname[len(XLA_LOGGER):]
    bound = bind(call, ["message"])
    if level not in LEVELS or bound is None or set(bound) != {"message"}:
        sc.needs_manual(rule.code, "cannot read the call: log with loguru on rank 0 by hand", qualname)
        return None
    sc.fixed(rule.code, qualname)
    plan = sc.file.import_plan
    logged = parse_expr(plan.fill("{loguru}.logger.") + level)
    message = bound["message"].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT, comma=cst.MaybeSentinel.DEFAULT)
    return sc.fill(GLOBAL_MASTER), cst.Call(func=logged, args=[message])


@transform("xla_logger", form=CALL)
def xla_logger(call, qualname, sc: StatementContext, rule):
    parts = _logger_parts(call, qualname, sc, rule)
    if parts is None:
        return call
    condition, logged = parts
    return cst.IfExp(test=parse_expr(condition), body=logged, orelse=cst.Name("None"))


@transform("xla_logger", form=STATEMENT)
def xla_logger_statement(call, qualname, sc: StatementContext, rule, plans):
    parts = _logger_parts(call, qualname, sc, rule)
    if parts is None:
        return None
    condition, logged = parts
    guard = if_block(condition, [cst.SimpleStatementLine(body=[cst.Expr(logged)])])
    sc.file.mark(guard.body, "guard", condition)  # merged with the next guard, as master_print's
    return [guard]
