"""Index expressions (spec.IndexExpr) as MLIR: an `affine.apply` where an affine map can say
it (the output for such expressions stays what it always was), index arithmetic otherwise.

Both the export's count region and the generated functions compute them. Arithmetic rounds
as the expression language does (Python's floor division and %), so `arith.floordivsi`,
`arith.ceildivsi` and a floor remainder; `min`/`max` are `arith.minsi`/`arith.maxsi`.
A divisor over symbols may be 0 in some call: the functions check it (`cf.assert`) before
any division, and before the dispatch whose count region divides by it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from kitdispatch.emit.mlir_text import mlir_string
from kitdispatch.describe.index_expr import IndexExpr

_ARITH = {ast.Add: "arith.addi", ast.Sub: "arith.subi", ast.Mult: "arith.muli", ast.FloorDiv: "arith.floordivsi"}
_CALLS = {"ceildiv": "arith.ceildivsi", "min": "arith.minsi", "max": "arith.maxsi"}


@dataclass(frozen=True)
class IndexOp:
    """One line: `%ssa = rhs`, or `rhs` alone (ssa None) for an op without a result."""

    ssa: str | None
    rhs: str

    @property
    def text(self) -> str:
        return f"%{self.ssa} = {self.rhs}" if self.ssa else self.rhs


def affine_map(expr: IndexExpr, symbol_index: dict[str, int]) -> str:
    """A map over every symbol of `symbol_index`, so operands are the same for each use."""
    symbols = ", ".join(f"s{i}" for i in range(len(symbol_index)))
    used = symbol_index if expr.symbols else {}
    head = f"()[{symbols}]" if used else "()"
    return f"affine_map<{head} -> ({expr.affine(symbol_index)})>"


class IndexOps:
    """Emits the ops computing index expressions into one region, naming results through
    `take` (a stem -> unique SSA name function) and reading symbols from `symbol_ssa`.
    `checked` says whether this region may fail a call (`cf.assert`): a function may, a
    count region may not (its function checked the same values before the dispatch)."""

    def __init__(self, take: Callable[[str], str], symbol_ssa: dict[str, str], *, checked: bool) -> None:
        self.take = take
        self.symbol_ssa = symbol_ssa
        self.checked = checked
        self.ops: list[IndexOp] = []
        self._constants: dict[int, str] = {}
        self._what = ""

    def value(self, expr: IndexExpr, ssa: str, *, symbols: tuple[str, ...] | None = None, what: str = "") -> str:
        """Emits `%ssa = <expr>`; an affine expression is one `affine.apply` over `symbols`
        (default: its own), as the kit has always rendered it. `what` names the expression
        in a failed check."""
        if expr.is_affine:
            symbols = expr.symbols if symbols is None else symbols
            index = {s: i for i, s in enumerate(symbols)}
            operands = ", ".join(f"%{self.symbol_ssa[s]}" for s in symbols) if expr.symbols else ""
            self.ops.append(IndexOp(ssa, f"affine.apply {affine_map(expr, index)}()[{operands}]"))
            return ssa
        self._what = what or f"index expression '{expr}'"
        self.ops.append(IndexOp(ssa, self._rhs(expr.tree)))
        return ssa

    def check_divisors(self, expr: IndexExpr, what: str) -> None:
        """Fails the call where a divisor of `expr` over symbols is 0 (a count region divides
        by it later, and cannot fail the call itself)."""
        if expr.is_affine:
            return
        self._what = what
        for node in ast.walk(expr.tree):
            divisor = _divisor(node)
            if divisor is not None and not _constant(divisor):
                self._nonzero(self._emit(divisor))

    def check_at_most(self, value: str, limit: int, message: str) -> None:
        """Fails the call with `message` unless value <= limit."""
        ok = self._op("fits", f"arith.cmpi sle, %{value}, %{self.constant(limit)} : index")
        self.ops.append(IndexOp(None, f"cf.assert %{ok}, {mlir_string(message)}"))

    def constant(self, value: int) -> str:
        if value not in self._constants:
            self._constants[value] = self._op(f"c{value}" if value >= 0 else f"c_neg{-value}", f"arith.constant {value} : index")
        return self._constants[value]

    # -- arithmetic ----------------------------------------------------------------------

    def _emit(self, node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return self.symbol_ssa[node.id]
        if _constant(node):
            return self.constant(IndexExpr("", node).evaluate({}))
        return self._op("v", self._rhs(node))

    def _rhs(self, node: ast.expr) -> str:
        """The right-hand side of the op computing `node`, its operands emitted first."""
        if isinstance(node, ast.UnaryOp):
            return f"arith.subi %{self.constant(0)}, %{self._emit(node.operand)} : index"
        if isinstance(node, ast.Call):
            name = node.func.id
            args = [self._emit(a) for a in node.args]
            if name == "ceildiv" and self.checked and not _constant(node.args[1]):
                self._nonzero(args[1])
            while len(args) > 2:  # min(a, b, c) = min(min(a, b), c)
                args = [self._op(name, f"{_CALLS[name]} %{args[0]}, %{args[1]} : index"), *args[2:]]
            return f"{_CALLS[name]} %{args[0]}, %{args[1]} : index"
        lhs, rhs = self._emit(node.left), self._emit(node.right)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and self.checked and not _constant(node.right):
            self._nonzero(rhs)
        if isinstance(node.op, ast.Mod):  # a - floor(a / b) * b: Python's %, as evaluate()
            quotient = self._op("q", f"arith.floordivsi %{lhs}, %{rhs} : index")
            product = self._op("qb", f"arith.muli %{quotient}, %{rhs} : index")
            return f"arith.subi %{lhs}, %{product} : index"
        return f"{_ARITH[type(node.op)]} %{lhs}, %{rhs} : index"

    def _nonzero(self, divisor: str) -> None:
        if not self.checked:
            return
        ok = self._op("nonzero", f"arith.cmpi ne, %{divisor}, %{self.constant(0)} : index")
        message = f"{self._what} divides by a value that is 0 in this call"
        self.ops.append(IndexOp(None, f"cf.assert %{ok}, {mlir_string(message)}"))

    def _op(self, stem: str, rhs: str) -> str:
        ssa = self.take(stem)
        self.ops.append(IndexOp(ssa, rhs))
        return ssa


def _divisor(node: ast.expr) -> ast.expr | None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
        return node.right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ceildiv":
        return node.args[1]
    return None


def _constant(node: ast.expr) -> bool:
    return not IndexExpr("", node).symbols


