"""Planting mutants: small, realistic bugs put into a module's source, one at a time.

Each :class:`Mutant` is one edit of the source text (the rest of the file stays byte for byte), of
the kinds that slip through reviews of guard code:

=====================  =============================================================
operator               what it plants
=====================  =============================================================
``boundary``           ``<`` <-> ``<=``, ``>`` <-> ``>=``: a boundary off by one
``negate-compare``     ``==`` <-> ``!=``, ``in`` <-> ``not in``, ``is`` <-> ``is not``
``and-or``             ``and`` <-> ``or``
``negate-condition``   the test of an ``if``, ``while``, conditional expression or
                       comprehension filter turned into ``not (...)``
``drop-not``           ``not x`` -> ``x``
``constant``           an integer ``n`` -> ``n + 1``, a float ``x`` -> ``x + 1``,
                       ``True`` <-> ``False``
``drop-return``        a return that is not the last statement of its function -> ``pass``
``drop-raise``         ``raise ...`` -> ``pass``
=====================  =============================================================

What is never mutated: logging calls (and a condition that only decides whether to log),
f-strings and other strings, type annotations, decorators, ``__all__``, and the arguments of a
``raise`` (its message), since a changed message is not a broken guard. A negated condition that
another operator already plants (``if a == b``, ``if not x``) is planted once.
A module's ``scope`` (function or class names) limits planting to the guards inside it.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["Mutant", "plant"]

_BOUNDARY = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_NEGATE = {"==": "!=", "!=": "==", "in": "not in", "not in": "in", "is": "is not", "is not": "is"}
_OP_TEXT = re.compile(r"<=|>=|==|!=|<|>|\bnot\s+in\b|\bis\s+not\b|\bin\b|\bis\b")
_LOGGERS = {"log", "logger", "logging"}
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


@dataclass(frozen=True)
class Mutant:
    """One planted bug: where it is, what it changes, and the span of source it replaces."""

    path: str  # relative to the repository root
    index: int  # its place among the module's mutants, in source order
    line: int
    where: str  # the enclosing function or class (dotted), or "<module>"
    operator: str
    before: str
    after: str
    start: int  # character offsets of the replaced span in the original source
    end: int
    shown: str  # the mutation as the report shows it: the whole comparison or condition, before -> after

    def describe(self) -> str:
        return self.shown

    def apply(self, source: str) -> str:
        return source[: self.start] + self.after + source[self.end :]


def _one_line(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


class _Source:
    """Character offsets of AST positions (which count UTF-8 bytes within a line)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts = [0]
        for line in text.splitlines(keepends=True):
            self._starts.append(self._starts[-1] + len(line))

    def offset(self, line: int, col_bytes: int) -> int:
        start = self._starts[line - 1]
        line_text = self.text[start : self._starts[line]] if line < len(self._starts) else self.text[start:]
        return start + len(line_text.encode()[:col_bytes].decode(errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
        assert end_line is not None and end_col is not None
        return self.offset(node.lineno, node.col_offset), self.offset(end_line, end_col)  # type: ignore[attr-defined]

    def between(self, a: ast.AST, b: ast.AST) -> tuple[int, int]:
        """The text from the end of ``a`` to the start of ``b`` (an operator, parentheses, spaces)."""
        return self.span(a)[1], self.span(b)[0]


@dataclass
class _Found:
    line: int
    where: str
    operator: str
    start: int
    end: int
    after: str
    context: tuple[int, int] | None = None  # the expression an operator belongs to, shown in the report


class _Planter(ast.NodeVisitor):
    def __init__(self, source: _Source, scope: Sequence[str]) -> None:
        self.source = source
        self.scope = tuple(scope)
        self.found: list[_Found] = []
        self._where: list[str] = []
        self._function_ends: list[ast.stmt] = []

    # -- where we are -----------------------------------------------------------------------------

    @property
    def where(self) -> str:
        return ".".join(self._where) or "<module>"

    def _in_scope(self) -> bool:
        if not self.scope:
            return True
        return any(self.where == s or self.where.startswith(s + ".") for s in self.scope)

    def _add(self, node: ast.AST, operator: str, start: int, end: int, after: str, in_node: bool = False) -> None:
        if self._in_scope():
            context = self.source.span(node) if in_node else None
            self.found.append(_Found(getattr(node, "lineno", 0), self.where, operator, start, end, after, context))

    def _named(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._where.append(node.name)  # decorators (dataclass options, contextmanager) are left alone
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                self.visit(stmt)
        else:
            self._defaults(node.args)
            self._function_ends.append(node.body[-1])
            for stmt in node.body:
                self.visit(stmt)
            self._function_ends.pop()
        self._where.pop()

    def _defaults(self, args: ast.arguments) -> None:
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(default)

    visit_FunctionDef = _named
    visit_AsyncFunctionDef = _named
    visit_ClassDef = _named

    # -- what is left alone -----------------------------------------------------------------------

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if _is_logging(node):
            return
        self.generic_visit(node)

    # -- statements -------------------------------------------------------------------------------

    def visit_Raise(self, node: ast.Raise) -> None:
        start, end = self.source.span(node)
        self._add(node, "drop-raise", start, end, "pass")

    def visit_Return(self, node: ast.Return) -> None:
        if self._function_ends and node is not self._function_ends[-1]:
            start, end = self.source.span(node)
            self._add(node, "drop-return", start, end, "pass")
        if node.value is not None:
            self.visit(node.value)

    def visit_If(self, node: ast.If) -> None:
        if not node.orelse and all(_logs(stmt) for stmt in node.body):
            return  # a condition that only decides whether to log
        self._negate(node.test)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        for test in node.ifs:
            self._negate(test)
        self.generic_visit(node)

    def _negate(self, test: ast.expr) -> None:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return  # drop-not plants the same bug
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and not isinstance(test.ops[0], _ORDER):
            return  # so does negate-compare
        start, end = self.source.span(test)
        self._add(test, "negate-condition", start, end, f"not ({self.source.text[start:end]})")

    # -- expressions ------------------------------------------------------------------------------

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for left, right in itertools.pairwise(operands):
            start, end = self.source.between(left, right)
            gap = self.source.text[start:end]
            match = _OP_TEXT.search(gap)
            if match is None:
                continue
            op = " ".join(match.group().split())
            for operator, table in (("boundary", _BOUNDARY), ("negate-compare", _NEGATE)):
                if op in table:
                    self._add(node, operator, start + match.start(), start + match.end(), table[op], in_node=True)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        word, other = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        for left, right in itertools.pairwise(node.values):
            start, end = self.source.between(left, right)
            match = re.search(rf"\b{word}\b", self.source.text[start:end])
            if match is not None:
                self._add(node, "and-or", start + match.start(), start + match.end(), other, in_node=True)
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            start, end = self.source.span(node)
            inner_start, inner_end = self.source.span(node.operand)
            self._add(node, "drop-not", start, end, f"({self.source.text[inner_start:inner_end]})")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            after = repr(not value)
        elif isinstance(value, int):
            after = repr(value + 1)
        elif isinstance(value, float):
            after = repr(value + 1.0)
        else:
            return
        start, end = self.source.span(node)
        self._add(node, "constant", start, end, after)

    def visit_arg(self, node: ast.arg) -> None:
        return  # annotations

    def visit_arguments(self, node: ast.arguments) -> None:
        return  # defaults are visited with their function, annotations never


def _is_logging(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in _LOGGERS


def _logs(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and _is_logging(stmt.value)


def _raise_args(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a raise's exception (its message): left alone."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            for part in (node.exc, node.cause):
                if part is not None:
                    inside |= {id(n) for n in ast.walk(part)}
    return inside


def _found(source: _Source, tree: ast.Module, scope: Sequence[str]) -> Iterator[_Found]:
    planter = _Planter(source, scope)
    planter.visit(tree)
    yield from planter.found


def _line_of(text: str, found: _Found) -> tuple[int, int]:
    """The source line a constant sits on: ``3`` alone would not say which 3."""
    start = text.rfind("\n", 0, found.start) + 1
    end = text.find("\n", found.end)
    return start, len(text) if end < 0 else end


def plant(path: str, text: str, scope: Sequence[str] = ()) -> list[Mutant]:
    """Every mutant of ``text`` (the source of ``path``), in source order; each one compiles."""
    source = _Source(text)
    tree = ast.parse(text, filename=path)
    quiet = _raise_args(tree)
    spans = {}
    for node in ast.walk(tree):
        if id(node) in quiet and hasattr(node, "end_col_offset"):
            spans[source.span(node)] = True
    mutants: list[Mutant] = []
    seen: set[tuple[int, int, str]] = set()
    for found in sorted(_found(source, tree, scope), key=lambda f: (f.start, f.end, f.operator)):
        if any(s <= found.start and found.end <= e for (s, e) in spans) or (found.start, found.end, found.after) in seen:
            continue
        seen.add((found.start, found.end, found.after))
        if found.context is not None:
            shown_start, shown_end = found.context
        elif found.operator == "constant":
            shown_start, shown_end = _line_of(text, found)
        else:
            shown_start, shown_end = found.start, found.end
        shown = (f"{_one_line(text[shown_start:shown_end])} -> "
                 f"{_one_line(text[shown_start:found.start] + found.after + text[found.end:shown_end])}")
        mutant = Mutant(path, len(mutants), found.line, found.where, found.operator, text[found.start : found.end],
                        found.after, found.start, found.end, shown)
        try:
            compile(mutant.apply(text), path, "exec")
        except SyntaxError:
            continue
        mutants.append(mutant)
    return mutants
