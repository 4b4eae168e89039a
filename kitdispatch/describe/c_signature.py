"""Reading `__global__` kernel signatures out of CUDA C++ source text.

The kit infers a kernel's bindings and push constants from the kernel itself, so this reads
what a compiler front end would see of each signature. Comments and literals are lexed
properly (line numbers stay true), preprocessor directives are skipped (with `#if 0` blocks
dropped), and object-like macros that spell `__global__` or `extern "C"` are expanded. It is
not a C++ parser: it reads declarations at namespace scope, skips function and class bodies,
and treats identifiers it does not know in a signature as attribute macros.

Why a parser of our own, measured (benchmarks/signature_sources.py, results in
benchmarks/results/signature-sources.txt, every kernel of kernels/, samples/, tests/data/):
- The compiler (NVRTC's PTX `.entry`, lowered names) knows the parameters' sizes, order and
  the mangled entry, but not their C names or const-ness: `simple_mul_param_0 (8 bytes)`.
  Inference needs both (`shapes = { x = ... }` names a parameter; `const` makes it `in`).
  So the kit takes from the compiler what it knows better and keeps it as the last word:
  entries (`nvrtcGetLoweredName`), parameter count, sizes and order, struct sizes and block
  limits (ptx.check_kernel_against_ptx), loads and stores through pointers
  (ptx.param_accesses, roles.py), and the parameter types it resolved (check/declarations.py).
  `__launch_bounds__` and template-ness are no longer read here: the PTX's `.maxntid` /
  `.reqntid` are what is checked.
- libclang (the PyPI wheel, 18.1.1) with the CUDA headers fails on every source: the wheel
  has no clang resource headers (`limits.h` not found), 101 ms a file. Without them (CUDA's attributes defined by hand) it read 30 of 31 kernels as this
  parser does, with errors in 7 of 14 files (`float4` unknown) and `size_t` read as `int`;
  at 7.8 ms a file (median) against 2.1 ms, plus a 62 MB dependency.
So this parser stays, for names, const-ness and C types as written, and the compiler checks
everything it can see.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from kitdispatch.errors import ManifestError

# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CParam:
    """One C parameter of a kernel, as declared."""

    name: str  # "" when the declaration leaves it unnamed
    type: str  # normalized C spelling: "const float *", "int", "float *const *"
    is_pointer: bool
    is_const_pointee: bool  # the pointed-to object is const: a read-only buffer
    base_type: str  # the scalar or pointee type without qualifiers: "float", "unsigned int"


@dataclass(frozen=True)
class KernelSignature:
    """A `__global__` function as the source declares it."""

    name: str
    params: tuple[CParam, ...]
    extern_c: bool
    line: int  # 1-based line of the name


def parse_kernels(source: str, *, path: str = "<source>") -> dict[str, KernelSignature]:
    """Every `__global__` function in `source`, by name, in order of first declaration.

    A kernel that is declared and later defined appears once: the definition's parameters
    win (they carry the names), `extern "C"` on either declaration counts.
    """
    if not isinstance(source, str):
        raise ManifestError(
            f"kernel source must be text, not {type(source).__name__}",
            where=path,
            fix="read the .cu file as text (e.g. Path.read_text()) before parsing it",
        )
    return dict(_parsed(source, path))


@functools.lru_cache(maxsize=64)
def _parsed(source: str, path: str) -> tuple[tuple[str, KernelSignature], ...]:
    """Kernels of one source text, parsed once: a file with several kernels in a manifest is
    asked for each of them (KernelSignature is frozen, so sharing the result is safe)."""
    kernels: dict[str, KernelSignature] = {}
    defined: set[str] = set()
    aliases: list[list[_Tok]] = []
    for toks, extern_c, is_definition in _kernel_declarations(_tokens(source, path), path, aliases):
        sig = _kernel(toks, extern_c, path)
        if sig is None:
            continue
        old = kernels.get(sig.name)
        if old is not None:
            keep = sig if is_definition and sig.name not in defined else old
            sig = replace(keep, extern_c=old.extern_c or sig.extern_c)
        kernels[sig.name] = sig
        if is_definition:
            defined.add(sig.name)
    resolve = _alias_resolver(aliases)
    return tuple((name, _with_resolved_types(sig, resolve)) for name, sig in kernels.items())


def _with_resolved_types(sig: KernelSignature, resolve: Callable[[str], str]) -> KernelSignature:
    params = tuple(replace(c, base_type=resolve(c.base_type)) for c in sig.params)
    return sig if params == sig.params else replace(sig, params=params)


def _alias_resolver(aliases: list[list[_Tok]]) -> Callable[[str], str]:
    """Resolves names that `typedef X Y;` or `using Y = X;` at namespace scope declare to
    their types (`floatX` -> `__nv_bfloat16`), through chains; a name declared as different
    types (in `#if` branches this parser cannot decide) is left as it is."""
    targets: dict[str, set[str]] = {}
    for decl in aliases:
        found = _alias(decl)
        if found is not None:
            targets.setdefault(found[0], set()).add(found[1])
    table = {name: next(iter(types)) for name, types in targets.items() if len(types) == 1}

    def resolve(name: str) -> str:
        seen = set()
        while name in table and name not in seen:
            seen.add(name)
            name = table[name]
        return name

    return resolve


def _alias(decl: list[_Tok]) -> tuple[str, str] | None:
    """(alias, type) of a `typedef TYPE NAME` or `using NAME = TYPE` declaration of a plain
    (not pointer, array or function) type; None for anything else."""
    texts = [t.text for t in decl]
    if texts[:1] == ["typedef"] and len(decl) >= 3 and decl[-1].kind == "id":
        name, type_toks = decl[-1].text, decl[1:-1]
    elif texts[:1] == ["using"] and len(decl) >= 4 and decl[1].kind == "id" and texts[2] == "=":
        name, type_toks = decl[1].text, decl[3:]
    else:
        return None
    words = [t for t in type_toks if t.text not in _QUALIFIERS and t.text not in _IGNORED_WORDS]
    if not words or any(t.text in ("*", "&", "&&", "(", "[", "{") for t in words):
        return None
    if all(t.text in _BUILTIN_WORDS for t in words):
        return name, _builtin_type([t.text for t in words])
    rendered = _render(list(words))
    if not re.fullmatch(r"(?:::)?\w+(?:::\w+)*", rendered):
        return None  # a template-id or an expression: not read
    return name, _typedef(rendered)


def find_kernel(source: str, name: str, *, path: str = "<source>") -> KernelSignature:
    """The `__global__` function `name`; a missing one is an error that lists what is there."""
    kernels = parse_kernels(source, path=path)
    if name in kernels:
        return kernels[name]
    found = sorted(kernels.values(), key=lambda k: k.line)
    listing = ", ".join(f"{k.name} ({path}:{k.line})" for k in found) or "none"
    close = difflib.get_close_matches(str(name), [k.name for k in found], n=1)
    fix = f'declare it `extern "C" __global__ void {name}(...)` in {path}, or correct the kernel name'
    raise ManifestError(
        f"no __global__ function {name!r} in {path} (kernels found: {listing})",
        where=path,
        fix=f"did you mean {close[0]!r}? correct the kernel name" if close else fix,
    )


def compiled_signature(name: str, mangled: str, *, template_argument: bool = False) -> KernelSignature | None:
    """A C++ kernel's parameters as the compiler resolved them (a template's `T`, typedefs,
    macros), read from its mangled entry name: `_Z5scaleIfEvPT_PKS0_i` is
    `void scale<float>(float*, float const*, int)`; with `template_argument`, from the function
    type that is the entry's template argument (`void probe<void (*)(float*, int)>()`). Names
    are empty and the line is 0; None where the name cannot be demangled or its parameters read."""
    text = _demangle(mangled)
    if text is not None and template_argument:
        text = _first_template_argument(text)
    end = text.rfind(")") if text is not None else -1
    if end < 0:
        return None
    depth = 0
    for i in range(end, -1, -1):  # the parameter list is the last balanced (...)
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            break
    try:
        sig = parse_kernels(f"__global__ void k{text[i : end + 1]};", path=f"<compiled {name}>").get("k")
    except ManifestError:
        return None  # a parameter this parser cannot read (a function reference): not checked
    return replace(sig, name=name, line=0) if sig is not None else None


def _first_template_argument(text: str) -> str | None:
    """`void f<void (*)(int*)>()` -> `void (*)(int*)`."""
    start = text.find("<")
    depth = 0
    for i in range(max(start, 0), len(text)):
        depth += {"<": 1, ">": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i] if start >= 0 else None
    return None


@functools.lru_cache(maxsize=1)
def _cxa_demangle() -> Callable[[str], str | None] | None:
    """The C++ runtime's demangler (libstdc++'s __cxa_demangle, which every CUDA host has),
    or None where there is none."""
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    libc.free.argtypes = [ctypes.c_void_p]

    def demangle(mangled: str) -> str | None:
        status = ctypes.c_int()
        out = fn(mangled.encode(), None, None, ctypes.byref(status))
        if not out:
            return None
        try:
            return ctypes.string_at(out).decode() if status.value == 0 else None
        finally:
            libc.free(out)

    return demangle


def _demangle(mangled: str) -> str | None:
    demangle = _cxa_demangle()
    return demangle(mangled) if demangle is not None and mangled.startswith("_Z") else None


# ------------------------------------------------------------------------------ lexing


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # "id", "num", "str" (string or char literal) or "punct"
    text: str
    line: int
    start: int  # offset in the source: tells `#define F(x)` from `#define F (x)`


# One alternative per C token; the last matches any character, so the scan never stalls.
_TOKEN_RE = re.compile(
    r"""
    (?P<nl>\n)
  | (?P<ws>(?:[ \t\r\f\v\ufeff]|\\\r?\n)+)
  | (?P<comment>//(?:\\\r?\n|[^\n])*|/\*[\s\S]*?\*/)
  | (?P<open_comment>/\*)
  | (?P<raw>(?:u8|[uUL])?R"(?P<delim>[^()\\\s"]{0,16})\()
  | (?P<str>(?:u8|[uUL])?"(?:[^"\\\n]|\\[\s\S])*"?)
  | (?P<chr>(?:u8|[uUL])?'(?:[^'\\\n]|\\[\s\S])*'?)
  | (?P<num>\.?\d(?:[eEpP][+-]|'?[\w.])*)
  | (?P<id>[^\W\d]\w*)
  | (?P<punct>::|->|\.\.\.|<<=|>>=|<<|>>|&&|\|\||\+\+|--|\#\#|[-+*/%=!<>&|^]=|[\s\S])
    """,
    re.VERBOSE,
)
_KINDS = {"raw": "str", "str": "str", "chr": "str", "num": "num", "id": "id", "punct": "punct"}
# Object-like macros whose bodies use one of these are expanded: they decide what a kernel is.
_SIGNATURE_MACRO_WORDS = frozenset({"__global__", "extern", "__launch_bounds__"})


def _tokens(source: str, path: str) -> list[_Tok]:
    """The live tokens of `source`: no comments, directives or `#if 0` code."""
    out: list[_Tok] = []
    pre = _Preprocessor()
    directive: list[_Tok] | None = None  # the directive being read, if any
    at_line_start, line, pos = True, 1, 0
    while pos < len(source):
        m = _TOKEN_RE.match(source, pos)
        kind, text = m.lastgroup, m.group()
        if kind == "raw":  # R"delim( runs to )delim"; searched by hand, once, to stay linear
            end = source.find(f'){m["delim"]}"', m.end())
            if end < 0:
                raise _unclosed("raw string literal", f'){m["delim"]}"', path, line)
            text = source[pos : end + len(m["delim"]) + 2]
        pos += len(text)
        if kind == "nl":
            if directive is not None:
                pre.directive(directive)
                directive = None
            at_line_start = True
        elif kind == "open_comment":
            raise _unclosed("/* comment", "*/", path, line)
        elif kind not in ("ws", "comment"):
            tok = _Tok(_KINDS[kind], text, line, m.start())
            if directive is not None:
                directive.append(tok)
            elif at_line_start and text == "#":
                directive = []
            elif pre.live:
                out.extend(pre.expand(tok))
            at_line_start = False
        line += text.count("\n")
    if directive is not None:
        pre.directive(directive)
    return out


def _unclosed(what: str, closer: str, path: str, line: int) -> ManifestError:
    return ManifestError(f"a {what} is never closed", where=f"{path}:{line}", fix=f"close it with {closer}")


class _Preprocessor:
    """What the kit needs of the C preprocessor: which lines are live, and kernel macros.

    `#if 0` / `#if 1` are decided; any other condition leaves every branch live, since
    the kernels it guards are usually the CUDA side of a host/device split.
    """

    def __init__(self) -> None:
        # Per open #if: (this branch is live: True, False or None for unknown, an earlier
        # branch surely ran, an earlier branch maybe ran, the lines around the #if are live).
        self.frames: list[tuple[bool | None, bool, bool, bool]] = []
        self.macros: dict[str, tuple[_Tok, ...]] = {}
        self.live = True

    def expand(self, tok: _Tok) -> tuple[_Tok, ...]:
        body = self.macros.get(tok.text) if tok.kind == "id" else None
        if body is None:
            return (tok,)
        return tuple(_Tok(b.kind, b.text, tok.line, tok.start) for b in body)

    def directive(self, toks: list[_Tok]) -> None:
        word, rest = (toks[0].text, toks[1:]) if toks else ("", [])
        frame = self.frames[-1] if self.frames else None
        if word in ("if", "ifdef", "ifndef"):
            state = _truth(rest) if word == "if" else None
            self.frames.append((state, state is True, state is None, self.live))
        elif word in ("elif", "else") and frame:
            _, ran, maybe_ran, outer = frame
            if ran:
                state = False
            else:
                state = _truth(rest) if word == "elif" else (None if maybe_ran else True)
            self.frames[-1] = (state, ran or state is True, maybe_ran or state is None, outer)
        elif word == "endif" and frame:
            self.frames.pop()
        elif word in ("define", "undef") and self.live and rest and rest[0].kind == "id":
            self._define(word, rest)
        top = self.frames[-1] if self.frames else None
        self.live = top is None or (top[3] and top[0] is not False)

    def _define(self, word: str, rest: list[_Tok]) -> None:
        name = rest[0]
        if word == "undef":
            self.macros.pop(name.text, None)
            return
        function_like = len(rest) > 1 and rest[1].text == "(" and rest[1].start == name.start + len(name.text)
        body = [t.text for t in rest[1:]]
        # `}` alone closes what a macro such as `#define BEGIN_C extern "C" {` opened.
        if not function_like and (_SIGNATURE_MACRO_WORDS.intersection(body) or body == ["}"]):
            self.macros[name.text] = tuple(e for t in rest[1:] for e in self.expand(t))


def _truth(toks: list[_Tok]) -> bool | None:
    """The value of an `#if` that is a literal number, else None (unknown)."""
    value = _int_value(toks)
    return None if value is None else value != 0


# ------------------------------------------------------------------------ declarations


@dataclass(frozen=True, slots=True)
class _Group:
    """A bracketed run of tokens, `( ... )`, `[ ... ]` or `{ ... }`, seen as one item."""

    open: _Tok
    inner: tuple[_Tok, ...]
    close: _Tok

    @property
    def line(self) -> int:
        return self.open.line


_Item = _Tok | _Group
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def _close(toks: list[_Tok] | tuple[_Tok, ...], i: int) -> tuple[int, bool]:
    """(index of the bracket closing toks[i], True), or (where the group broke off, False).

    A `;` outside braces cannot be inside a bracketed part of a declaration, so it stops
    the scan: one missing `)` does not swallow the rest of the file.
    """
    want: list[str] = []
    for j in range(i, len(toks)):
        text = toks[j].text
        if text in _CLOSERS:
            want.append(_CLOSERS[text])
        elif text in (")", "]", "}"):
            if text != want[-1]:
                return j, False
            want.pop()
            if not want:
                return j, True
        elif text == ";" and "}" not in want:
            return j, False
    return len(toks), False


def _items(toks: list[_Tok] | tuple[_Tok, ...]) -> list[_Item]:
    """Tokens with each balanced bracket group folded into one `_Group`."""
    items: list[_Item] = []
    i = 0
    while i < len(toks):
        if toks[i].text in _CLOSERS:
            end, ok = _close(toks, i)
            if ok:
                items.append(_Group(toks[i], tuple(toks[i + 1 : end]), toks[end]))
                i = end + 1
                continue
        items.append(toks[i])
        i += 1
    return items


def _kernel_declarations(
    toks: list[_Tok], path: str, aliases: list[list[_Tok]] | None = None
) -> Iterator[tuple[list[_Tok], bool, bool]]:
    """Each namespace-scope declaration that mentions `__global__`, as
    (its tokens up to the body or `;`, inside an extern "C" block, is a definition);
    `typedef` and `using` declarations go to `aliases`."""
    scopes: list[str] = []  # per open block: "C", "C++" (linkage blocks) or "namespace"
    decl: list[_Tok] = []
    i = 0
    while i < len(toks):
        text = toks[i].text
        if text in ("(", "["):
            end, ok = _close(toks, i)
            if not ok:
                if _mentions_global(decl):
                    raise ManifestError(
                        f"unbalanced {text!r} in the declaration of a __global__ function",
                        where=f"{path}:{toks[i].line}",
                        fix=f"close the {text!r}; the signature must be complete C",
                    )
                decl, i = [], end  # not a kernel: drop it and read on from where it broke
                continue
            decl.extend(toks[i : end + 1])
            i = end + 1
            continue
        if text == "{":
            scope = _block_scope(decl)
            if scope:
                scopes.append(scope)
                i += 1
            else:
                if _mentions_global(decl):
                    yield decl, _in_extern_c(scopes), True
                i = _skip_body(toks, i)
            decl = []
            continue
        if text in (";", "}"):
            if _mentions_global(decl):
                yield decl, _in_extern_c(scopes), False
            elif aliases is not None and text == ";" and decl and decl[0].text in ("typedef", "using"):
                aliases.append(decl)
            if text == "}" and scopes:
                scopes.pop()
            decl = []
        else:
            decl.append(toks[i])
        i += 1


def _mentions_global(toks: list[_Tok]) -> bool:
    return any(t.text == "__global__" for t in toks)


def _block_scope(decl: list[_Tok]) -> str:
    """What a `{` after `decl` opens: "C"/"C++" (extern blocks), "namespace", or "" (a body)."""
    texts = [t.text for t in decl]
    if len(decl) == 2 and texts[0] == "extern" and decl[1].kind == "str":
        return "C" if texts[1] == '"C"' else "C++"
    if (texts[:1] == ["namespace"] or texts[:2] == ["inline", "namespace"]) and "=" not in texts:
        return "namespace"
    return ""


def _in_extern_c(scopes: list[str]) -> bool:
    return next((s for s in reversed(scopes) if s != "namespace"), "") == "C"


def _skip_body(toks: list[_Tok], i: int) -> int:
    """Index after the `}` that closes the body opening at toks[i] (the end, if none does)."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text == "{":
            depth += 1
        elif toks[j].text == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(toks)


# ---------------------------------------------------------------------------- kernels

_BUILTIN_WORDS = frozenset(
    "void bool _Bool char wchar_t char8_t char16_t char32_t short int long signed unsigned "
    "float double __int128".split()
)
_QUALIFIERS = ("const", "volatile")
# Words that change nothing the kit reads from a parameter.
_IGNORED_WORDS = frozenset(
    "__restrict__ __restrict restrict __grid_constant__ register struct class union enum typename".split()
)
# Words followed by a parenthesized argument list that are not the function's name.
_ATTRIBUTE_CALLS = frozenset(
    "__launch_bounds__ __attribute__ __declspec alignas __align__ __cluster_dims__ __maxnreg__ "
    "decltype noexcept throw sizeof alignof".split()
)
_NOT_NAMES = (
    _BUILTIN_WORDS
    | _IGNORED_WORDS
    | _ATTRIBUTE_CALLS
    | frozenset(_QUALIFIERS)
    | frozenset(
        "__global__ __device__ __host__ __forceinline__ __noinline__ extern static inline "
        "template operator return auto".split()
    )
)
# Fixed-width typedefs spelled the same with or without `std::`.
_STD_TYPEDEFS = frozenset(
    "int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t ptrdiff_t "
    "intptr_t uintptr_t".split()
)


def _is(item: _Item, text: str) -> bool:
    return isinstance(item, _Tok) and item.text == text


def _kernel(toks: list[_Tok], extern_c: bool, path: str) -> KernelSignature | None:
    items = _items(toks)
    globals_ = [it for it in items if _is(it, "__global__")]
    if not globals_:
        return None
    items = _without_template_headers(items, path)
    for j, item in enumerate(items):
        if _is(item, "->") or _is(item, "="):  # trailing return type, `= delete`
            items = items[:j]
            break
    found = _declarator(items)
    if found is None:
        raise ManifestError(
            "a __global__ declaration without a readable name and parameter list",
            where=f"{path}:{globals_[0].line}",
            fix="declare kernels as `__global__ void NAME(PARAMS)`; macros that hide the name or "
            "the parameter list are not read",
        )
    k, p = found
    prefix = items[:k]
    if not any(_is(it, "__global__") for it in prefix):
        return None
    for a, b in zip(prefix, prefix[1:]):
        if _is(a, "extern") and isinstance(b, _Tok) and b.kind == "str":
            extern_c = b.text == '"C"'
    name = items[k]
    params = _params(items[p], name.text, path)
    return KernelSignature(name.text, params, extern_c, name.line)


def _without_template_headers(items: list[_Item], path: str) -> list[_Item]:
    out: list[_Item] = []
    i = 0
    while i < len(items):
        if _is(items[i], "template") and i + 1 < len(items) and _is(items[i + 1], "<"):
            end = _angle_close(items, i + 1)
            if end is None:
                raise ManifestError(
                    "a template header whose '<' is never closed",
                    where=f"{path}:{items[i + 1].line}",
                    fix="close the template parameter list with '>'",
                )
            i = end + 1
            continue
        out.append(items[i])
        i += 1
    return out


_ANGLE_STEP = {"<": 1, ">": -1, ">>": -2}


def _angle_close(items: list[_Item], i: int) -> int | None:
    """Index of the `>` closing the `<` at items[i] (`>>` closes two)."""
    depth = 0
    for j in range(i, len(items)):
        item = items[j]
        if isinstance(item, _Tok) and item.text in _ANGLE_STEP:
            depth += _ANGLE_STEP[item.text]
            if depth <= 0:
                return j
    return None


def _angle_openers(items: list[_Item]) -> dict[int, int]:
    """For each `>` (or `>>`) that closes a `<`, the index of the outermost `<` it closes."""
    opened: list[int] = []
    openers: dict[int, int] = {}
    for j, item in enumerate(items):
        if _is(item, "<"):
            opened.append(j)
        elif (_is(item, ">") or _is(item, ">>")) and opened:
            closed = opened[-len(item.text) :]  # `>>` closes two
            del opened[-len(closed) :]
            openers[j] = closed[0]
    return openers


def _declarator(items: list[_Item]) -> tuple[int, int] | None:
    """(index of the name, index of the parameter group): the last `NAME(...)` that is not an
    attribute such as `__launch_bounds__(...)`, so macros before the name are passed over."""
    best = None
    openers = _angle_openers(items)
    for j in range(1, len(items)):
        if not (isinstance(items[j], _Group) and items[j].open.text == "("):
            continue
        k = j - 1
        if k in openers:  # an explicit specialization: k<float>(...)
            k = openers[k] - 1
            if k < 0:
                continue
        name = items[k]
        if isinstance(name, _Tok) and name.kind == "id" and name.text not in _NOT_NAMES:
            best = (k, j)
    return best


_INT_RE = re.compile(r"0[xX][0-9a-fA-F]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*")


def _int_value(items: list[_Item]) -> int | None:
    """The value of a C integer literal, possibly parenthesized; None for anything else."""
    toks = list(_flat(items))
    depth = 0  # `((256))`: peel paren pairs by counting, not by re-grouping each level
    while len(toks) > 2 * depth + 1 and toks[depth].text == "(" and toks[-1 - depth].text == ")":
        depth += 1
    if len(toks) != 2 * depth + 1 or toks[depth].kind != "num":
        return None
    digits = toks[depth].text.replace("'", "").rstrip("uUlLzZ")
    if not _INT_RE.fullmatch(digits):
        return None
    return int(digits, 8) if digits[0] == "0" and digits[1:].isdigit() else int(digits, 0)


def _split_list(items: list[_Item]) -> list[list[_Item]]:
    """Splits at top-level commas; commas inside template arguments (`Map<K, V>`) do not
    split, except in a default value, where `<` is more likely a comparison."""
    parts: list[list[_Item]] = [[]]
    angle, in_default = 0, False
    for item in items:
        if isinstance(item, _Tok):
            if item.text == "," and (angle <= 0 or in_default):
                parts.append([])
                angle, in_default = 0, False
                continue
            if item.text == "=":
                in_default = True
            elif not in_default:
                angle += _ANGLE_STEP.get(item.text, 0)
        parts[-1].append(item)
    return parts


# ------------------------------------------------------------------------- parameters


def _params(group: _Group, kernel: str, path: str) -> tuple[CParam, ...]:
    parts = _split_list(_items(group.inner))
    if parts == [[]] or (len(parts) == 1 and len(parts[0]) == 1 and _is(parts[0][0], "void")):
        return ()
    return tuple(
        _param(part, i, kernel, f"{path}:{part[0].line if part else group.line}")
        for i, part in enumerate(parts)
    )


def _param(items: list[_Item], index: int, kernel: str, where: str) -> CParam:
    def bad(why: str) -> ManifestError:
        return ManifestError(
            f"cannot read parameter {index} of kernel {kernel!r}: {why}",
            where=where,
            fix="write each parameter as TYPE NAME, e.g. `const float* x` or `int n`",
        )

    items = next((items[:j] for j, it in enumerate(items) if _is(it, "=")), items)  # no default
    pack = any(_is(it, "...") for it in items)
    items = _without_attributes([it for it in items if not _is(it, "...")])
    if not items:
        raise bad("a variadic parameter list" if pack else "an empty parameter")
    whole, array = items, False
    while len(items) > 1 and isinstance(items[-1], _Group) and items[-1].open.text == "[":
        items, array = items[:-1], True  # `float x[]` is `float *x`
    if any(isinstance(it, _Group) for it in items):
        return _opaque_param(whole)
    words = _words(items, bad)
    name = ""
    if len(words) > 1 and words[-1][0] == "name" and words[-1][1].isidentifier():
        if any(kind != "qual" for kind, _ in words[:-1]):  # `const T` is a type, not `T` named
            name = words.pop()[1]
    return _typed_param(name, words, array, pack, bad)


def _typed_param(
    name: str, words: list[tuple[str, str]], array: bool, pack: bool, bad: Callable[[str], ManifestError]
) -> CParam:
    """The parameter's type from its words: the base type, then the pointer levels."""
    cut = next((j for j, (kind, _) in enumerate(words) if kind in ("*", "&")), len(words))
    base_words, declarator = words[:cut], words[cut:]
    builtins = [w for kind, w in base_words if kind == "builtin"]
    names = [w for kind, w in base_words if kind == "name"]
    if builtins:  # other names here are attribute macros
        base = _builtin_type(builtins)
    elif names:  # the last name is the type; earlier ones are attribute macros (`IN T x`)
        base = _typedef(names[-1])
    else:
        raise bad("it has no type")
    levels: list[list[str]] = []  # qualifiers of each pointer level, innermost first
    ref = ""
    for kind, word in declarator:
        if kind == "*":
            levels.append([])
        elif kind == "&":
            ref = word
        elif kind == "qual" and levels and not ref:
            levels[-1].append(word)
        elif kind == "builtin":
            raise bad(f"{word!r} after the declarator")
    if array:
        levels.append([])
    base_quals = [w for kind, w in base_words if kind == "qual"]
    text = " ".join([*_ordered(base_quals), base])
    for level in levels:  # clang's spelling: "float **", "float *const *"
        text += ("*" if text.endswith("*") else " *") + " ".join(_ordered(level))
    text += ("" if text.endswith("*") else " ") * bool(ref) + ref + "..." * pack
    is_pointer = bool(levels) and not ref
    pointee_quals = levels[-2] if len(levels) > 1 else base_quals
    return CParam(name, text, is_pointer, is_pointer and "const" in pointee_quals, base)


_PARAM_ATTRIBUTES = frozenset({"__attribute__", "alignas", "__declspec", "__align__"})


def _without_attributes(items: list[_Item]) -> list[_Item]:
    """Drops `__attribute__((...))`, `alignas(...)` and `[[...]]` from a parameter."""
    out: list[_Item] = []
    for item in items:
        if isinstance(item, _Group):
            if out and isinstance(out[-1], _Tok) and out[-1].text in _PARAM_ATTRIBUTES:
                out.pop()
                continue
            if item.open.text == "[" and item.inner and item.inner[0].text == "[":
                continue
        out.append(item)
    return out


def _opaque_param(items: list[_Item]) -> CParam:
    """A declarator in parentheses (`void (*f)(int)`): named and typed as written."""
    group = next(it for it in items if isinstance(it, _Group))
    names = [t.text for t in group.inner if t.kind == "id" and t.text not in _NOT_NAMES]
    is_pointer = any(t.text == "*" for t in group.inner)
    base = _render(items[: items.index(group)])
    return CParam(names[-1] if names else "", _render(items), is_pointer, False, base)


def _words(items: list[_Item], bad: Callable[[str], ManifestError]) -> list[tuple[str, str]]:
    """A parameter as (kind, text) words: builtin, qual, name (`a::b<c>` is one), * or &."""
    words: list[tuple[str, str]] = []
    i = 0
    while i < len(items):
        item = items[i]
        assert isinstance(item, _Tok)  # groups were handled by the caller
        text = item.text
        if text in _BUILTIN_WORDS:
            words.append(("builtin", text))
        elif text in _QUALIFIERS:
            words.append(("qual", text))
        elif text in ("*", "&", "&&"):
            words.append(("*" if text == "*" else "&", text))
        elif item.kind == "id" and text not in _IGNORED_WORDS or text == "::":
            end = _name_end(items, i)
            words.append(("name", _render(items[i:end])))
            i = end
            continue
        elif text not in _IGNORED_WORDS:
            raise bad(f"unexpected {text!r}")
        i += 1
    return words


def _name_end(items: list[_Item], i: int) -> int:
    """End of the (qualified, templated) type name starting at items[i]: `std::int64_t`,
    `Tile<float, 4>`, `Outer<T>::type`."""
    j, n = i, len(items)
    while j < n:
        if _is(items[j], "::"):
            j += 1
        if not (j < n and isinstance(items[j], _Tok) and items[j].kind == "id"):
            break
        j += 1
        if j < n and _is(items[j], "<"):
            close = _angle_close(items, j)
            if close is None:
                break
            j = close + 1
        if not (j < n and _is(items[j], "::")):
            break
    return max(j, i + 1)


def _flat(items: list[_Item]) -> Iterator[_Tok]:
    for item in items:
        yield from (item.open, *item.inner, item.close) if isinstance(item, _Group) else (item,)


def _render(items: list[_Item]) -> str:
    """Tokens as C text, spaced only where words would otherwise run together."""
    out: list[str] = []
    for tok in _flat(items):
        if out and _wordy(out[-1][-1]) and (_wordy(tok.text[0]) or tok.text[0] in "\"'"):
            out.append(" ")
        out.append(tok.text + " " * (tok.text == ","))
    return "".join(out).strip()


def _wordy(char: str) -> bool:
    return char.isalnum() or char == "_"


def _ordered(quals: list[str]) -> list[str]:
    return [q for q in _QUALIFIERS if q in quals]


def _builtin_type(words: list[str]) -> str:
    """One spelling per builtin type: `unsigned` is "unsigned int", `long long int` is
    "long long", `short int` is "short"; `char`, `signed char` and `unsigned char` differ."""
    longs = words.count("long")
    sign = "unsigned " if "unsigned" in words else ""
    rest = [w for w in words if w not in ("long", "signed", "unsigned", "int")]
    if rest == ["char"] and not longs:
        return sign + "char" if sign or "signed" not in words else "signed char"
    if rest == ["short"] and not longs:
        return sign + "short"
    if rest == ["__int128"] and not longs:
        return sign + "__int128"
    if not rest and longs <= 2:
        return sign + ("int", "long", "long long")[longs]
    return " ".join(words)  # float, double, bool, long double, or a mix C rejects anyway


def _typedef(name: str) -> str:
    for prefix in ("::std::", "std::", "::"):
        if name.startswith(prefix) and name[len(prefix) :] in _STD_TYPEDEFS:
            return name[len(prefix) :]
    return name
