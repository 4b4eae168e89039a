"""Index expressions over sizes and integer scalars (`ceildiv(m, 128)`, `min(n, 4)`, `sizeof(float)`)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from kitdispatch.describe import abi
from kitdispatch.errors import ManifestError
from kitdispatch.describe.limits import MAX_CONSTANT, MAX_EXPRESSION_LENGTH
from kitdispatch.describe.names import _shown, check_identifier


# Functions an index expression may call, with how many arguments each takes (min, max).
INDEX_FUNCTIONS = {"ceildiv": (2, 2), "min": (2, 16), "max": (2, 16), "sizeof": (1, 1)}


@dataclass(frozen=True)
class IndexExpr:
    """An integer expression over symbols (sizes and integer scalars), as host code states
    launch math: + - *, // % and ceildiv(a, b), min(a, b, ...), max(a, b, ...), and
    sizeof(TYPE) (a C or kit type: sizeof(float) is 4). Division and % round as Python's do
    (floor). Affine ones (products and divisors by constants) render as affine maps, others
    as index arithmetic (render.py)."""

    text: str
    tree: ast.expr = field(compare=False, repr=False)

    @classmethod
    def parse(cls, value: object, where: str) -> "IndexExpr":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ManifestError(
                f"{value!r} is not an index expression",
                where=where,
                fix="use an integer or a string such as 'ceildiv(n, 64)' or 'n // 32 + 1'",
            )
        if isinstance(value, int) and abs(value) > MAX_CONSTANT:
            raise ManifestError(f"{value} is too large for an index", where=where, fix=f"use integers below {MAX_CONSTANT}")
        text = str(value)
        if len(text) > MAX_EXPRESSION_LENGTH or text.count("(") > 64:
            raise ManifestError(
                f"index expression {_shown(text)} is too long or too deeply nested",
                where=where,
                fix=f"keep it under {MAX_EXPRESSION_LENGTH} characters and 64 levels of parentheses",
            )
        try:
            tree = ast.parse(text.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a NUL
            raise ManifestError(
                f"cannot parse index expression {_shown(text)}: {getattr(exc, 'msg', None) or type(exc).__name__}",
                where=where,
                fix=EXPRESSION_HELP,
            ) from None
        expr = cls(text, tree)
        expr._check(tree, where)
        return expr

    @property
    def symbols(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node in _walk_values(self.tree):
            if isinstance(node, ast.Name):
                seen.setdefault(node.id, None)
        return tuple(seen)

    @property
    def constant(self) -> int | None:
        return None if self.symbols else self._fold(self.tree)

    @property
    def is_affine(self) -> bool:
        """Whether an affine map can say it: symbols multiplied and divided only by constants
        (divisors positive), no min or max."""
        return _affine_node(self, self.tree)

    def affine(self, symbol_index: dict[str, int]) -> str:
        """Renders this (affine) expression in MLIR affine syntax with symbols s0, s1, ..."""
        return self._affine(self.tree, symbol_index)

    def _check(self, node: ast.expr, where: str) -> None:
        bad = lambda why: ManifestError(  # noqa: E731
            f"index expression {self.text!r} is not an integer expression the kit can compute: {why}",
            where=where,
            fix=EXPRESSION_HELP,
        )
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise bad(f"{node.value!r} is not an integer")
            if abs(node.value) > MAX_CONSTANT:
                raise bad(f"{node.value} is too large for an index")
        elif isinstance(node, ast.Name):
            check_identifier(node.id, "symbol", where)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            self._check(node.operand, where)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            self._check(node.left, where)
            self._check(node.right, where)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            self._check_divisor(node.left, node.right, where, bad)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in INDEX_FUNCTIONS and not node.keywords:
            low, high = INDEX_FUNCTIONS[node.func.id]
            if not low <= len(node.args) <= high:
                raise bad(f"{node.func.id}() takes {low if low == high else f'{low} to {high}'} arguments, got {len(node.args)}")
            if node.func.id == "sizeof":
                _sizeof(node, bad)
            elif node.func.id == "ceildiv":
                self._check_divisor(node.args[0], node.args[1], where, bad)
            else:
                for arg in node.args:
                    self._check(arg, where)
        else:
            raise bad(f"unsupported syntax {ast.unparse(node)!r}")

    def _check_divisor(self, lhs: ast.expr, rhs: ast.expr, where: str, bad: Callable[[str], ManifestError]) -> None:
        """A constant divisor must be positive; one over symbols is checked at each call."""
        self._check(lhs, where)
        self._check(rhs, where)
        if self._is_const(rhs) and self._fold(rhs) <= 0:
            raise bad(f"divisor {ast.unparse(rhs)!r} is not a positive integer")

    def _is_const(self, node: ast.expr) -> bool:
        return not any(isinstance(n, ast.Name) for n in _walk_values(node))

    def _fold(self, node: ast.expr) -> int:
        return self.evaluate({}, node)

    def evaluate(self, values: dict[str, int], node: ast.expr | None = None) -> int:
        node = self.tree if node is None else node
        ev = lambda n: self.evaluate(values, n)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.UnaryOp):
            return -ev(node.operand)
        if isinstance(node, ast.Call):
            name = node.func.id
            if name == "sizeof":
                return _sizeof(node)
            if name in ("min", "max"):
                return (min if name == "min" else max)(ev(a) for a in node.args)
            return -(-ev(node.args[0]) // ev(node.args[1]))
        ops = {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.FloorDiv: lambda a, b: a // b,
            ast.Mod: lambda a, b: a % b,
        }
        return ops[type(node.op)](ev(node.left), ev(node.right))

    def _affine(self, node: ast.expr, idx: dict[str, int]) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        if isinstance(node, ast.Name):
            return f"s{idx[node.id]}"
        if isinstance(node, ast.UnaryOp):
            return f"-({self._affine(node.operand, idx)})"
        if isinstance(node, ast.Call):
            if node.func.id == "sizeof":
                return str(_sizeof(node))
            return f"({self._affine(node.args[0], idx)}) ceildiv ({self._affine(node.args[1], idx)})"
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "floordiv", ast.Mod: "mod"}[
            type(node.op)
        ]
        return f"({self._affine(node.left, idx)}) {op} ({self._affine(node.right, idx)})"

    def __str__(self) -> str:
        return self.text


EXPRESSION_HELP = (
    "use integers, names of sizes and integer scalars, + - * // %, ceildiv(a, b), min(a, b, ...), "
    "max(a, b, ...) and sizeof(TYPE), e.g. 'ceildiv(B * T, 256)' or '(2 + block_y) * C * sizeof(float)'"
)


def _walk_values(node: ast.expr):
    """The nodes of an expression that are values, breadth first as ast.walk (symbol order
    is the workload's): not callees, not sizeof's type name."""
    queue = [node]
    while queue:
        node = queue.pop(0)
        if isinstance(node, ast.Call):
            sizeof = isinstance(node.func, ast.Name) and node.func.id == "sizeof"
            queue += [] if sizeof else node.args
            continue
        yield node
        queue += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]


def _sizeof(node: ast.Call, bad: Callable[[str], ManifestError] | None = None) -> int:
    """sizeof(float), sizeof(f16), sizeof(int64_t): a type name of abi.py, C's or the kit's."""
    arg = node.args[0]
    row = (abi.BY_C_NAME.get(arg.id) or abi.BY_NAME.get(arg.id)) if isinstance(arg, ast.Name) else None
    if row is None:
        if bad is None:
            raise ValueError(ast.unparse(node))
        raise bad(f"{ast.unparse(node)!r} names no type the kit knows (one word: float, int, double, f16, i64 ...)")
    return row.size


def _affine_node(expr: IndexExpr, node: ast.expr) -> bool:
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.UnaryOp):
        return _affine_node(expr, node.operand)
    if isinstance(node, ast.Call):
        if node.func.id == "sizeof":
            return True
        if node.func.id != "ceildiv":
            return False
        lhs, rhs = node.args
    elif isinstance(node.op, (ast.FloorDiv, ast.Mod)):
        lhs, rhs = node.left, node.right
    elif isinstance(node.op, ast.Mult):
        sides = (node.left, node.right)
        return all(_affine_node(expr, s) for s in sides) and any(expr._is_const(s) for s in sides)
    else:
        return _affine_node(expr, node.left) and _affine_node(expr, node.right)
    return _affine_node(expr, lhs) and expr._is_const(rhs) and expr._fold(rhs) > 0


# Comparisons a condition may make between two index expressions.
_CHECKS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}
CONDITION_HELP = (
    "compare index expressions with < <= > >= == != and join them with && || ! and parentheses, "
    "e.g. 'ceildiv(m, 128) * ceildiv(n, 128) <= 12 && k >= 768'"
)


@dataclass(frozen=True)
class Condition:
    """A boolean condition over sizes (`replace_when.when`): comparisons of index expressions
    joined by && || ! (C's spelling; Python's and/or/not are accepted too). Each side is an
    IndexExpr, checked as one."""

    text: str
    tree: ast.expr = field(compare=False, repr=False)

    @classmethod
    def parse(cls, value: object, where: str) -> "Condition":
        if not isinstance(value, str):
            raise ManifestError(f"{value!r} is not a condition", where=where, fix=CONDITION_HELP)
        if len(value) > MAX_EXPRESSION_LENGTH or value.count("(") > 64:
            raise ManifestError(
                f"condition {_shown(value)} is too long or too deeply nested",
                where=where,
                fix=f"keep it under {MAX_EXPRESSION_LENGTH} characters and 64 levels of parentheses",
            )
        python = value.replace("&&", " and ").replace("||", " or ").replace("!=", " \0 ").replace("!", " not ").replace(" \0 ", "!=")
        try:
            tree = ast.parse(python.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            raise ManifestError(
                f"cannot parse condition {_shown(value)}: {getattr(exc, 'msg', None) or type(exc).__name__}",
                where=where,
                fix=CONDITION_HELP,
            ) from None
        condition = cls(value, tree)
        condition._check(tree, where)
        return condition

    def _check(self, node: ast.expr, where: str) -> None:
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check(value, where)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check(node.operand, where)
        elif isinstance(node, ast.Compare) and all(type(op) in _CHECKS for op in node.ops):
            for side in (node.left, *node.comparators):
                IndexExpr(ast.unparse(side), side)._check(side, where)
        else:
            raise ManifestError(
                f"condition {self.text!r}: {ast.unparse(node)!r} is not a comparison of index expressions",
                where=where,
                fix=CONDITION_HELP,
            )

    @property
    def symbols(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    seen.update(dict.fromkeys(IndexExpr(ast.unparse(side), side).symbols))
        return tuple(seen)

    def holds(self, values: dict[str, int], node: ast.expr | None = None) -> bool:
        """Whether the condition holds for these sizes; ZeroDivisionError where a divisor over
        the sizes is 0."""
        node = self.tree if node is None else node
        if isinstance(node, ast.BoolOp):
            parts = (self.holds(values, v) for v in node.values)
            return all(parts) if isinstance(node.op, ast.And) else any(parts)
        if isinstance(node, ast.UnaryOp):
            return not self.holds(values, node.operand)
        sides = [IndexExpr(ast.unparse(s), s).evaluate(values) for s in (node.left, *node.comparators)]
        return all(_CHECKS[type(op)](a, b) for op, a, b in zip(node.ops, sides, sides[1:]))

    def __str__(self) -> str:
        return self.text
