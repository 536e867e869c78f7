"""Apply the rules to a libcst module, visiting only the statements the analysis flagged.

A full libcst traversal costs as much as parsing the file (measured: 11.6 ms to visit vs 11.0 ms
to parse a 90-line training script), so this module does not run one transformer over the
module. It walks the statement lists of the CST and of Python's `ast` side by side (both list
statements in source order) and runs an `ExprRewriter` (expressions.py) only on the statements,
or compound statement headers, where `names.analyze` found a torch_xla reference or an "xla"
string. Statement-level rules reach it through the registry (registry.py); where comments and
TODOs go is layout.py's job.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import libcst as cst

from tpu_migrate.rewrite import dependencies, named_expressions, transforms
from tpu_migrate.rewrite.constant_tests import constant_truth
from tpu_migrate.rewrite.context import FileContext, StatementContext
from tpu_migrate.rewrite.expressions import ExprRewriter
from tpu_migrate.rewrite.inert import is_inert
from tpu_migrate.rewrite.names import is_xla_name
from tpu_migrate.rewrite.layout import (
    add_todos,
    comments_of_removed_if,
    drop_done_todos,
    header_comments,
    prepend_lines,
    rebuild_line,
)
from tpu_migrate.rewrite.plans import Plans
from tpu_migrate.rewrite.rebuilt import with_body, with_changes
from tpu_migrate.rewrite.skeleton import Skeleton, SkeletonMiss
from tpu_migrate.rewrite.registry import REGISTRY, emits
from tpu_migrate.rewrite.transforms.common import GLOBAL_MASTER, LOCAL_MASTER
from tpu_migrate.rewrite.transforms.launch import insert_at_body_start

HOOKS = REGISTRY.hooks

_COMPOUND_AST = {
    cst.If: (ast.If,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.Try: (ast.Try,),
    cst.TryStar: (getattr(ast, "TryStar", ast.Try),),
    cst.Match: (ast.Match,),
}


def _suite_lines(suite: cst.BaseSuite) -> list[cst.BaseStatement]:
    """A block's statements; a one-line suite's (`if c: a(); b()  # why`) as a line of them."""
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    return [cst.SimpleStatementLine(body=suite.body, trailing_whitespace=suite.trailing_whitespace)]


class WalkError(Exception):
    """The CST and the ast disagree about the statement structure (a bug, reported per file)."""


class ModuleRewriter:
    def __init__(self, file: FileContext, plans: Plans, skeleton: Skeleton | None = None):
        self.file = file
        # libcst parsed a skeleton (skeleton.py): its placeholders, name -> (number, how many
        # ast statements each stands for); those a rule dropped or replaced go to file.gone.
        self.skeleton = skeleton
        self.placeholders = skeleton.placeholders if skeleton is not None else {}
        self.module: cst.Module | None = None
        self.plans = plans
        self.analysis = file.analysis
        names = file.import_plan.names  # formatted, not filled: comparing uses no module
        self.rank_tests = frozenset({LOCAL_MASTER.format(**names), *(
            named_expressions.expand(GLOBAL_MASTER, in_group).format(**names) for in_group in (False, True))})
        # The rank test of the `if` whose body is being rewritten (only some ranks run here),
        # None outside such a body or in a nested function.
        self.rank_gate: str | None = None

    # -- blocks -----------------------------------------------------------------------------

    def rewrite_module(self, module: cst.Module, tree: ast.Module) -> cst.Module:
        self.module = module
        body, carry = self.block(module.body, tree.body)
        if body is module.body:
            return module
        footer = [*carry, *module.footer] if carry else module.footer
        return module.with_changes(body=body, footer=footer)

    def block(
        self, stmts: Sequence[cst.BaseStatement], ast_stmts: list[ast.stmt]
    ) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
        """Rewrite a statement list. Returns it and the comments of removed trailing lines."""
        out: list[cst.BaseStatement] = []
        carry: list[cst.EmptyLine] = []
        cursor = 0
        unchanged = True
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                stands_for = self.placeholders and self.stands_for(stmt)
                count = stands_for[1] if stands_for else len(stmt.body)
                nodes = ast_stmts[cursor : cursor + count]
                cursor += count
                if len(nodes) != count:
                    raise WalkError("statement count mismatch")
                if stands_for:
                    if any(self.analysis.info(node).subtree_interesting for node in nodes):
                        raise SkeletonMiss("a left-out statement must be visited")
                    produced, removed_comments = [stmt], []
                else:
                    produced, removed_comments = self.simple_line(stmt, nodes)
            else:
                if cursor >= len(ast_stmts):
                    raise WalkError("statement count mismatch")
                node = ast_stmts[cursor]
                cursor += 1
                if not isinstance(node, _COMPOUND_AST.get(type(stmt), ())):
                    raise WalkError(f"{type(stmt).__name__} vs {type(node).__name__}")
                if self.untouched(stmt, node):
                    produced, removed_comments = [stmt], []
                else:
                    produced, removed_comments = self.compound(stmt, node)
            if unchanged and (len(produced) != 1 or produced[0] is not stmt or removed_comments):
                unchanged = False
            if produced:
                if carry:
                    produced[0] = prepend_lines(produced[0], carry)
                    carry = []
                out.extend(produced)
                carry = removed_comments
            else:
                carry.extend(removed_comments)
        if cursor != len(ast_stmts):
            raise WalkError("statement count mismatch")
        if unchanged:
            return stmts, []
        return self.tidy(out), carry

    def stands_for(self, line: cst.BaseStatement) -> tuple[int, int] | None:
        """(number, how many ast statements) of the placeholder `line`, if it is one."""
        if type(line) is not cst.SimpleStatementLine:
            return None
        small = line.body[0]
        if len(line.body) == 1 and type(small) is cst.Expr and type(small.value) is cst.Name:
            return self.placeholders.get(small.value.value)
        return None

    def expanded(self, statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """`statements`, which a rule moves to another indentation, with each placeholder among
        them (at any depth) replaced by the statements it stands for (Skeleton.statements)."""
        if not self.placeholders:
            return statements
        out = []
        for stmt in statements:
            found = self.stands_for(stmt)
            if found is None:
                out.append(stmt.visit(_Expand(self)) if not isinstance(stmt, cst.SimpleStatementLine) else stmt)
                continue
            number, _ = found
            inner = self.skeleton.statements(number, self.module)
            inner[0] = prepend_lines(inner[0], list(stmt.leading_lines))
            self.file.gone.add(number)
            out.extend(inner)
        return out

    def dropped(self, node: cst.CSTNode | None) -> None:
        """A rule dropped `node`: the placeholders in it go with it."""
        if self.placeholders and node is not None:
            node.visit(_Dropped(self))

    def tidy(self, out: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """Generated rank guards, as a reviewer would write them: consecutive guards with the
        same test become one `if`; a guard inside an `if` with the same test is dropped (its
        body stays)."""
        roles = [self.file.generated_role(getattr(stmt, "body", None)) for stmt in out]
        if not any(role for role, _ in roles):
            return out
        result: list[cst.BaseStatement] = []
        previous: str | None = None  # the condition of the guard just before, if any
        for stmt, (role, condition) in zip(out, roles):
            plain = isinstance(stmt, cst.If) and stmt.orelse is None
            if role == "guard" and plain and condition == self.rank_gate:
                inner = list(stmt.body.body)
                inner[0] = prepend_lines(inner[0], list(stmt.leading_lines))
                result.extend(inner)
                previous = None
                continue
            if role == "guard" and plain and condition == previous and not stmt.leading_lines:
                last = result[-1]
                body = last.body.with_changes(body=[*last.body.body, *stmt.body.body])
                self.file.mark(body, "guard", condition)
                result[-1] = last.with_changes(body=body)
                continue
            result.append(stmt)
            previous = condition if role == "guard" and plain else None
        return result

    def untouched(self, stmt: cst.BaseCompoundStatement, node: ast.stmt) -> bool:
        """Nothing in this compound statement, header or body, can change."""
        return not self.analysis.info(node).subtree_interesting

    def body_block(self, body: cst.BaseSuite, ast_body: list[ast.stmt]) -> cst.BaseSuite:
        original = body
        if isinstance(body, cst.SimpleStatementSuite):
            # `if c: stmt` becomes an indented block only if one of its statements changes.
            infos = [self.analysis.info(n) for n in ast_body]
            if not any(i.interesting for i in infos):
                return body
            body = cst.IndentedBlock(
                body=[cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)],
            )
        new_body, carry = self.block(body.body, ast_body)
        if new_body is body.body:
            return original
        if not new_body:
            new_body = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carry)]
            carry = []
            block = body.with_changes(body=new_body)
            self.file.mark(block, "pass")  # an `if` left with only this may go (compound)
            return block
        footer = [*carry, *body.footer] if carry else body.footer
        return body.with_changes(body=new_body, footer=footer)

    # -- simple statements ------------------------------------------------------------------

    def simple_line(
        self, line: cst.SimpleStatementLine, nodes: list[ast.stmt]
    ) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
        infos = [self.analysis.info(n) for n in nodes]
        if not any(i.interesting for i in infos):
            return [line], []
        pieces: list[cst.BaseSmallStatement | list[cst.BaseStatement]] = []
        todos, superseded = [], set()
        mark = self.findings_mark()
        for small, info in zip(line.body, infos):
            if not info.interesting:
                pieces.append(small)
                continue
            sc = StatementContext(self.file, info)
            sc.can_prefix = True
            result = self.small_statement(small, sc)
            if sc.before or sc.after:
                statements = result if isinstance(result, list) else [cst.SimpleStatementLine(
                    body=[result.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])]  # `a; b`: a line of its own
                result = [*sc.before, *statements, *sc.after]
            todos.extend(sc.todos_to_write())
            superseded |= sc.superseded
            pieces.append(result)
        if not todos and all(p is small for p, small in zip(pieces, line.body)):
            return [line], []
        line = self.without_done_todos(line, infos[0], *self.codes_since(mark), superseded)
        present = self.comments_above(infos[0], superseded) if todos else frozenset()
        return rebuild_line(line, pieces, todos, present)

    def findings_mark(self) -> tuple[int, int]:
        """How many fixes and manual findings the file has so far: where a statement's own start."""
        return len(self.file.fixes), len(self.file.manual)

    def codes_since(self, mark: tuple[int, int]) -> tuple[set[str], set[str]]:
        """The rules fixed, and those reported, since `mark`."""
        return ({f.code for f in self.file.fixes[mark[0]:]},
                {m.code for m in self.file.manual[mark[1]:]})

    def without_done_todos(self, stmt, info, fixed: set[str], reported: set[str], superseded=frozenset()):
        """`stmt` without the TODO(tpu-migrate) comments directly above it of the rules it
        converted (`fixed`) and reported nothing more of (`reported`: the statement's manual
        findings): an earlier run's note on code this run converts (the portable target left
        `xm.get_memory_info()` with one; the tpu target converts it). Their lines are no
        longer open work (engine._report_open_work). Nor those a finding rewords
        (`superseded`: StatementContext.supersede)."""
        done = fixed - reported
        if not done and not superseded:
            return stmt
        superseded = frozenset(" ".join(text.split()) for text in superseded)
        stmt, lines = drop_done_todos(stmt, info.first_line, self.file.source_lines, done, superseded)
        self.file.done_todo_lines.update(lines)
        return stmt

    def small_statement(self, small: cst.BaseSmallStatement, sc: StatementContext):
        self.flow_marks(sc)
        held = self.file.held.get(id(sc.info.node))
        if held is not None:
            return self.held(small, sc, held)
        for hook in HOOKS["statement"]:
            replaced = hook(small, sc)
            if replaced is not None:
                return replaced
        call = None
        if isinstance(small, (cst.Expr, cst.Assign)) and isinstance(small.value, cst.Call):
            call = small.value
        rewriter = ExprRewriter(sc, small, statement_call=call)
        snapshot = sc.snapshot()
        new_small = rewriter.rewrite(small)
        result = new_small
        if call is not None and isinstance(new_small, (cst.Expr, cst.Assign)) and isinstance(new_small.value, cst.Call):
            assign = new_small if isinstance(new_small, cst.Assign) else None
            statement_rule = transforms.statement_rule(new_small.value, sc, assign=assign is not None)
            if statement_rule is not None:
                rule, qualname = statement_rule
                replaced = transforms.apply_statement_rule(
                    rule, qualname, new_small.value, sc, self.plans, assign=assign
                )
                if replaced is not None:
                    result = replaced
            if result is new_small and id(call) in rewriter.deferred:
                # The statement rule left its call for a human (or may not run here): the
                # statement stays as it was, arguments included.
                sc.rollback(snapshot)
                result = small
        self.report_leftovers(sc)
        if result is not small:
            for hook in HOOKS["rewritten"]:
                result = hook(result, sc)
        if result is not small and isinstance(result, cst.Expr) and _is_conditional_call(result.value):
            # `f() if cond else None` (or `else g()`) as a statement reads better as an `if` block.
            value = result.value
            orelse = None
            if isinstance(value.orelse, cst.Call):
                orelse = cst.Else(body=_block_of(value.orelse))
            return [cst.If(test=value.test.with_changes(lpar=[], rpar=[]), body=_block_of(value.body), orelse=orelse)]
        return result

    def flow_marks(self, sc: StatementContext) -> None:
        """A TODO on each converted value the statement passes to a function of the user's that
        hands it to torch_xla (flows.passed_to_functions; the code is the converting rule's)."""
        node = id(sc.info.node)
        if node in self.file.flow_marks and node not in self.file.flow_marks_placed:
            self.file.flow_marks_placed.add(node)
            for line, col, code, message in self.file.flow_marks[node]:
                if sc.enabled(code):
                    sc.needs_manual(code, message, where=(line, col))

    @emits("TPU099")  # a held reference no rule matches (and every rule's code it matches)
    def held(self, small: cst.BaseSmallStatement, sc: StatementContext, why: tuple[str, bool]):
        """An assignment whose torch_xla value goes to a call left to torch_xla (flows.py): left
        byte for byte, its torch_xla references marked with the reason (a TODO comment only
        where the call itself is left for a human, not where this run only deferred it)."""
        message, todo = why
        for ref in [r for r in sc.info.refs if is_xla_name(r.qualname)]:
            rule = self.file.catalog.lookup(ref.qualname)
            code = rule.code if rule is not None else "TPU099"
            if sc.enabled(code):
                sc.needs_manual(code, message, ref.qualname, todo=todo)
            else:
                sc.consume(ref.qualname)
        self.report_leftovers(sc)
        return small

    def comments_above(self, info, superseded=frozenset()) -> frozenset[str]:
        """The comment lines directly above a statement in the input, but those a finding of
        this run rewords (`superseded`)."""
        lines = self.file.source_lines
        found = set()
        index = info.first_line - 2
        while index >= 0:
            text = lines[index].strip()
            if text and not text.startswith("#"):
                break
            if text:
                found.add(text)
            index -= 1
        gone = {" ".join(text.split()) for text in superseded}
        return frozenset(text for text in found if " ".join(text.split()) not in gone)

    @emits("TPU099")
    def report_leftovers(self, sc: StatementContext) -> None:
        for line, col, module in sc.info.dynamic_imports:
            if sc.enabled("TPU099"):
                sc.needs_manual(
                    "TPU099",
                    f'imports "{module}" by name at run time, which TorchTPU does not provide: '
                    "port what the module is used for by hand",
                    where=(line, col),
                )
        for line, col, requirement in sc.info.requirements:
            if sc.enabled(dependencies.CODE):
                sc.needs_manual(dependencies.CODE, dependencies.message(requirement), where=(line, col))
        for ref, doubt in sc.info.ambiguous:
            if sc.enabled("TPU099"):
                sc.needs_manual(
                    "TPU099",
                    f"`{ref.dotted}` ({ref.qualname}) may not be torch_xla's: {doubt}; not converted, "
                    "port it by hand if it is torch_xla's",
                    where=(ref.line, ref.col), anchor=ref.dotted,
                )
        for ref in sc.leftover_refs():
            if sc.enabled("TPU099"):
                sc.needs_manual(
                    "TPU099",
                    f"`{ref.dotted}` ({ref.qualname}) has no automatic TorchTPU conversion",
                    where=(ref.line, ref.col), anchor=ref.dotted,
                )

    # -- compound statements ----------------------------------------------------------------

    def compound(self, stmt: cst.BaseCompoundStatement, node: ast.stmt, elif_: bool = False):
        info = self.analysis.info(node)
        sc = StatementContext(self.file, info) if info.interesting else None
        test = getattr(stmt, "test", None)  # as parsed (an `if`'s: _folded_if)
        prefix: list[cst.BaseStatement] = []
        mark = self.findings_mark()
        if sc is not None:
            if isinstance(stmt, cst.With):
                for hook in HOOKS["with"]:
                    stmt = hook(stmt, sc)
                    if isinstance(stmt, list):
                        return self.unwrapped(stmt, node, info, sc)
            elif isinstance(stmt, cst.For):
                for hook in HOOKS["replace_loop"]:
                    replaced = hook(stmt, sc)
                    if replaced is not None:
                        self.dropped(stmt)
                        self.report_leftovers(sc)
                        return replaced, []
                for hook in HOOKS["loop"]:
                    stmt, first = hook(stmt, sc, self.plans, ExprRewriter(sc, stmt))
                    prefix.extend(first)
            stmt = ExprRewriter(sc, stmt).rewrite(stmt)

        # The header's own findings: those before its bodies' and after them.
        fixed, reported = self.codes_since(mark)
        # Bodies first (their statements pair with the ast), then insertions at their start.
        stmt = self.children(stmt, node)
        if prefix:
            stmt = insert_at_body_start(stmt, prefix)

        if sc is not None:
            mark = self.findings_mark()
            self.report_leftovers(sc)
            todos = sc.todos_to_write()
            more_fixed, more_reported = self.codes_since(mark)
            stmt = self.without_done_todos(stmt, info, fixed | more_fixed, reported | more_reported, sc.superseded)
            if todos:
                stmt = add_todos(stmt, todos, self.comments_above(info, sc.superseded))
        if not elif_ and (self._emptied_if(stmt, sc) or self._emptied_range_loop(stmt, sc)):
            return [], comments_of_removed_if(stmt)
        if not elif_:
            stmt = self._say_emptied(stmt, node)
        folded = None if elif_ or sc is None or getattr(stmt, "test", None) is test else self._folded_if(stmt, node, sc)
        if folded is not None:
            return folded
        return [stmt], []

    def _emptied_if(self, stmt, sc) -> bool:
        """An `if` without `else` whose body only held statements the rules removed (`if step %
        10 == 0: xm.mark_step()`), and whose test cannot do anything (no call): it can go."""
        return (
            isinstance(stmt, cst.If)
            and stmt.orelse is None
            and self.file.generated_role(stmt.body)[0] == "pass"
            and (sc is None or not (sc.todos or sc.leftover_refs()))
            and is_inert(stmt.test)
        )

    def _emptied_range_loop(self, stmt, sc) -> bool:
        """`for _ in range(n): xm.mark_step()`: a counted loop whose body the rules removed
        goes too, unless its variable is read anywhere else in the file (it stays bound after
        the loop)."""
        if not (
            isinstance(stmt, cst.For) and stmt.orelse is None and stmt.asynchronous is None
            and self.file.generated_role(stmt.body)[0] == "pass"
            and (sc is None or not (sc.todos or sc.leftover_refs()))
            and isinstance(stmt.target, cst.Name)
            and isinstance(stmt.iter, cst.Call) and _is_name(stmt.iter.func, "range")
            and all(is_inert(arg.value) and arg.star == "" for arg in stmt.iter.args)
        ):
            return False
        return stmt.target.value not in self.analysis.loaded_names

    def _say_emptied(self, stmt, node: ast.stmt):
        """A block the rules emptied that cannot go (its test or loop calls something): its
        `pass` says what it held, so a flag that no longer does anything does not pass for one
        that does (`if cfg.get_metrics(): pass`)."""
        body = getattr(stmt, "body", None)
        if not isinstance(stmt, (cst.If, cst.For, cst.While)) or getattr(stmt, "orelse", None) is not None \
                or not isinstance(body, cst.IndentedBlock) or self.file.generated_role(body)[0] != "pass":
            return stmt
        line = body.body[0]
        if not isinstance(line, cst.SimpleStatementLine) or line.trailing_whitespace.comment is not None:
            return stmt
        removed = _first_line(ast.unparse(node.body[0])) if node.body else ""
        note = cst.Comment(f"# tpu-migrate: removed `{removed}`; this block does nothing now")
        line = line.with_changes(trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "), comment=note))
        new_body = body.with_changes(body=[line, *body.body[1:]])
        self.file.mark(new_body, "pass")
        return stmt.with_changes(body=new_body)

    def _folded_if(self, stmt, node: ast.stmt, sc):
        """An `if` whose test a conversion made constant (target `tpu`: `xm.xla_device_hw(d) in
        ("TPU", "NEURON")` is `"TPU" in ("TPU", "NEURON")`): the branch that runs takes its
        place, as a reviewer would write it; (statements, comments for the next statement), or
        None. Only where the test was not constant before (the user's own `if True:` stays) and
        the branch that goes holds nothing the rules report on (its findings would point at
        code that is gone). The caller skips an `if` whose test the walk left as it was: its
        text is the input's, whose truth the first test below finds."""
        if not isinstance(stmt, cst.If) or constant_truth(node.test) is not None:
            return None
        truth = constant_truth(_CODEGEN.code_for_node(stmt.test))
        if truth is None:
            return None
        dropped = node.orelse if truth else node.body
        if any(self.analysis.info(inner).interesting for branch in dropped for inner in ast.walk(branch)
               if isinstance(inner, ast.stmt)):
            return None
        sc.dropped_code(dropped)  # an import only the dead branch used goes with it
        self.dropped(stmt.orelse if truth else stmt.body)
        if truth:
            kept, footer = self.expanded(_suite_lines(stmt.body)), getattr(stmt.body, "footer", [])
        elif isinstance(stmt.orelse, cst.Else):
            kept, footer = self.expanded(_suite_lines(stmt.orelse.body)), getattr(stmt.orelse.body, "footer", [])
        elif isinstance(stmt.orelse, cst.If):  # the `elif` is now the `if`, at its column
            kept, footer = [stmt.orelse], []
        else:
            kept, footer = [], []
        # The comment after the `if`'s colon; a one-line suite kept keeps it on its line.
        one_line = not isinstance(stmt.body, cst.IndentedBlock)
        header = stmt.body.trailing_whitespace if one_line else stmt.body.header
        above = [*stmt.leading_lines, *([] if one_line and truth else header_comments(header))]
        after = [line for line in footer if line.comment is not None]  # the block's closing comments
        if not kept:
            return [], [line for line in above if line.comment is not None] + after
        kept[0] = kept[0].with_changes(leading_lines=[*above, *kept[0].leading_lines])
        return kept, after

    def unwrapped(self, statements, node, info, sc):
        """`with torch_xla.step():` is gone: its body takes its place in the enclosing block."""
        body, carry = self.block(self.expanded(statements), node.body)
        self.report_leftovers(sc)
        todos = sc.todos_to_write()
        if body and todos:
            body[0] = add_todos(body[0], todos, self.comments_above(info))
        return body, carry

    def children(self, stmt: cst.BaseCompoundStatement, node: ast.stmt):
        if isinstance(stmt, cst.If):
            test = _CODEGEN.code_for_node(stmt.test)
            outer = self.rank_gate
            if test in self.rank_tests:
                self.rank_gate = test
            try:
                changes = {"body": self.body_block(stmt.body, node.body)}
            finally:
                self.rank_gate = outer
            if isinstance(stmt.orelse, cst.If):
                produced, _ = self.compound(stmt.orelse, node.orelse[0], elif_=True)
                changes["orelse"] = produced[0]
            elif stmt.orelse is not None:
                changes["orelse"] = with_body(stmt.orelse, self.body_block(stmt.orelse.body, node.orelse))
            return with_changes(stmt, **changes)
        if isinstance(stmt, (cst.For, cst.While)):
            changes = {"body": self.body_block(stmt.body, node.body)}
            if stmt.orelse is not None:
                changes["orelse"] = with_body(stmt.orelse, self.body_block(stmt.orelse.body, node.orelse))
            return with_changes(stmt, **changes)
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            # A function's body runs wherever it is called: no enclosing rank test holds there.
            outer, self.rank_gate = self.rank_gate, None
            try:
                return with_body(stmt, self.body_block(stmt.body, node.body))
            finally:
                self.rank_gate = outer
        if isinstance(stmt, cst.With):
            return with_body(stmt, self.body_block(stmt.body, node.body))
        if isinstance(stmt, (cst.Try, cst.TryStar)):
            handlers = [with_body(h, self.body_block(h.body, a.body)) for h, a in zip(stmt.handlers, node.handlers)]
            changes = {"body": self.body_block(stmt.body, node.body), "handlers": handlers}
            if stmt.orelse is not None:
                changes["orelse"] = with_body(stmt.orelse, self.body_block(stmt.orelse.body, node.orelse))
            if stmt.finalbody is not None:
                changes["finalbody"] = with_body(stmt.finalbody, self.body_block(stmt.finalbody.body, node.finalbody))
            return with_changes(stmt, **changes)
        if isinstance(stmt, cst.Match):
            cases = [with_body(c, self.body_block(c.body, a.body)) for c, a in zip(stmt.cases, node.cases)]
            return with_changes(stmt, cases=cases)
        raise WalkError(f"unhandled compound statement {type(stmt).__name__}")


# -- helpers ----------------------------------------------------------------------------------


class _Expand(cst.CSTTransformer):
    """The placeholders in the blocks of a moved statement, replaced (ModuleRewriter.expanded)."""

    def __init__(self, walker: ModuleRewriter):
        super().__init__()
        self.walker = walker

    def visit_SimpleStatementLine(self, node) -> bool:
        return False  # no blocks inside

    def leave_IndentedBlock(self, original, updated):
        if not any(self.walker.stands_for(stmt) for stmt in updated.body):
            return updated
        return updated.with_changes(body=self.walker.expanded(list(updated.body)))


class _Dropped(cst.CSTVisitor):
    """Records the placeholders in a dropped statement as gone."""

    def __init__(self, walker: ModuleRewriter):
        super().__init__()
        self.walker = walker

    def visit_SimpleStatementLine(self, node) -> bool:
        found = self.walker.stands_for(node)
        if found is not None:
            self.walker.file.gone.add(found[0])
        return False


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _first_line(code: str, limit: int = 60) -> str:
    first = code.splitlines()[0] if code else ""
    return first if len(first) <= limit and "\n" not in code else first[: limit - 3].rstrip() + "..."


def _is_conditional_call(node: cst.BaseExpression) -> bool:
    return (
        isinstance(node, cst.IfExp)
        and isinstance(node.body, cst.Call)
        and (isinstance(node.orelse, cst.Call)
             or (isinstance(node.orelse, cst.Name) and node.orelse.value == "None"))
    )


def _block_of(call: cst.Call) -> cst.IndentedBlock:
    return cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Expr(call)])])


_CODEGEN = cst.Module(body=[])


__all__ = ["ModuleRewriter", "WalkError"]
