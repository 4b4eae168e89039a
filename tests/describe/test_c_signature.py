"""Reading __global__ signatures out of CUDA source: a table of real-world spellings, the
errors, and properties over generated signatures and arbitrary text."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kitdispatch import ManifestError
from kitdispatch.describe.c_signature import CParam, KernelSignature, find_kernel, parse_kernels


def ptr(name, type_, base, *, const=False):
    return CParam(name, type_, True, const, base)


def val(name, type_, base=None):
    return CParam(name, type_, False, False, base or type_)


def kernel(name, params, *, line, extern_c=False):
    return KernelSignature(name, tuple(params), extern_c, line)


SIMPLE_MUL = [
    ptr("lhs", "const float *", "float", const=True),
    ptr("rhs", "const float *", "float", const=True),
    ptr("out", "float *", "float"),
    val("n", "int"),
]

# (source, the kernel's expected signature)
CASES = [
    pytest.param(
        'extern "C" __global__ void simple_mul(const float* lhs, const float* rhs, float* out, int n) {}',
        kernel("simple_mul", SIMPLE_MUL, line=1, extern_c=True),
        id="extern-c-one-line",
    ),
    pytest.param(
        'extern "C" {\n'
        "__global__ void simple_mul(const float*, const float*, float*, int);\n"
        "__global__ void other(int);\n"
        "}\n"
        "__global__ void simple_mul(const float* lhs, const float* rhs, float* out, int n) {\n"
        "  out[0] = lhs[0] * rhs[0];\n"
        "}\n",
        kernel("simple_mul", SIMPLE_MUL, line=5, extern_c=True),
        id="extern-c-block-prototype-then-definition",
    ),
    pytest.param(
        "template <typename T, int N = (3 > 2)>\n__global__ void axpy(const T* x, T* y, T a) {}",
        kernel(
            "axpy",
            [ptr("x", "const T *", "T", const=True), ptr("y", "T *", "T"), val("a", "T")],
            line=2,
        ),
        id="template",
    ),
    pytest.param(
        "template <typename T> __global__ void fill(T* x);\n"
        "template <> __global__ void fill<float>(float* x) {}\n",
        kernel("fill", [ptr("x", "float *", "float")], line=2),
        id="template-prototype-and-defined-specialization",
    ),
    pytest.param(
        "static __global__ void scale(float* x, float alpha) {}",
        kernel("scale", [ptr("x", "float *", "float"), val("alpha", "float")], line=1),
        id="static",
    ),
    pytest.param(
        "__global__\nvoid\ngemm(  // C = A * B\n"
        "    const __half* __restrict__ a,   /* row major */\n"
        "    const __half *__restrict b,\n"
        "    float*\n      c,\n"
        "    int m = 16,\n"
        "    int k = (1 < 2)) {\n}\n",
        kernel(
            "gemm",
            [
                ptr("a", "const __half *", "__half", const=True),
                ptr("b", "const __half *", "__half", const=True),
                ptr("c", "float *", "float"),
                val("m", "int"),
                val("k", "int"),
            ],
            line=3,
        ),
        id="multi-line-comments-defaults",
    ),
    pytest.param(
        "__global__ void ptrs(float** pp, const float** cpp, float* const* pcp, const float* const c) {}",
        kernel(
            "ptrs",
            [
                ptr("pp", "float **", "float"),
                ptr("cpp", "const float **", "float"),
                ptr("pcp", "float *const *", "float", const=True),
                ptr("c", "const float *const", "float", const=True),
            ],
            line=1,
        ),
        id="pointer-to-pointer-and-const-pointers",
    ),
    pytest.param(
        "__global__ void refs(const int& n, float& f) {}",
        kernel("refs", [val("n", "const int &", "int"), val("f", "float &", "float")], line=1),
        id="references",
    ),
    pytest.param(
        "#define KERNEL_API __attribute__((visibility(\"default\")))\n"
        "#define RESTRICT __restrict__\n"
        "KERNEL_API __global__ void api(float* RESTRICT x, const float* RESTRICT y) {}",
        kernel(
            "api",
            [ptr("x", "float *", "float"), ptr("y", "const float *", "float", const=True)],
            line=3,
        ),
        id="attribute-macros",
    ),
    pytest.param(
        '#define KERNEL extern "C" __global__ \\\n    __launch_bounds__(128)\n'
        "KERNEL void viamacro(int* x) {}",
        kernel("viamacro", [ptr("x", "int *", "int")], line=3, extern_c=True),
        id="kernel-macro-with-continuation",
    ),
    pytest.param(
        "__global__ void east(float const* x, int const n, volatile float* v) {}",
        kernel(
            "east",
            [
                ptr("x", "const float *", "float", const=True),
                val("n", "const int", "int"),
                ptr("v", "volatile float *", "float"),
            ],
            line=1,
        ),
        id="east-const-and-volatile",
    ),
    pytest.param(
        "__global__ void ints(unsigned a, long long int b, signed char c, unsigned short int d,\n"
        "                     long unsigned e, signed f, unsigned long long g, char h, short i) {}",
        kernel(
            "ints",
            [
                val("a", "unsigned int"),
                val("b", "long long"),
                val("c", "signed char"),
                val("d", "unsigned short"),
                val("e", "unsigned long"),
                val("f", "int"),
                val("g", "unsigned long long"),
                val("h", "char"),
                val("i", "short"),
            ],
            line=1,
        ),
        id="builtin-spellings",
    ),
    pytest.param(
        "__global__ void typedefs(int32_t a, std::int64_t b, ::size_t c, const __nv_bfloat16* d,\n"
        "    half* e, bool f, double g, float4* h, uint32_t i) {}",
        kernel(
            "typedefs",
            [
                val("a", "int32_t"),
                val("b", "int64_t"),
                val("c", "size_t"),
                ptr("d", "const __nv_bfloat16 *", "__nv_bfloat16", const=True),
                ptr("e", "half *", "half"),
                val("f", "bool"),
                val("g", "double"),
                ptr("h", "float4 *", "float4"),
                val("i", "uint32_t"),
            ],
            line=1,
        ),
        id="typedef-names",
    ),
    pytest.param(
        "struct Params { int n; };\n"
        "__global__ void grid(const __grid_constant__ Params p, Tile<float, 4>* t) {}",
        kernel(
            "grid",
            [val("p", "const Params", "Params"), ptr("t", "Tile<float, 4> *", "Tile<float, 4>")],
            line=2,
        ),
        id="grid-constant-and-template-argument-commas",
    ),
    pytest.param(
        "__global__ void nothing(void) {}",
        kernel("nothing", [], line=1),
        id="void-params",
    ),
    pytest.param(
        "__global__ void decays(float x[], const int y[4]);",
        kernel(
            "decays",
            [ptr("x", "float *", "float"), ptr("y", "const int *", "int", const=True)],
            line=1,
        ),
        id="array-params-decay",
    ),
    pytest.param(
        "#if 0\n__global__ void decays(int);\n#elif 0\nnot C at all (\n#else\n"
        "__global__ void live(int* x) {}\n#endif\n",
        kernel("live", [ptr("x", "int *", "int")], line=6),
        id="if-0-blocks",
    ),
    pytest.param(
        'extern "C" {\nnamespace ops {\n__device__ float helper(float* x) { return *x; }\n'
        "__host__ __device__ int both(int);\n"
        'extern "C++" { __global__ void cpp(int); }\n'
        "__global__ void inner(float* x) { helper(x); }\n}\n}\n",
        kernel("inner", [ptr("x", "float *", "float")], line=6, extern_c=True),
        id="namespace-inside-extern-c",
    ),
    pytest.param(
        'const char* s = "__global__ void fake(int); */ /*";\n'
        "char q = '\"';\n"
        'const char* r = R"x(__global__ void fake2(int);)x";\n'
        "// a comment that goes on \\\n__global__ void fake3(int);\n"
        "__global__ void real(int n) {}\n",
        kernel("real", [val("n", "int")], line=6),
        id="literals-and-spliced-comment",
    ),
    pytest.param(
        "\ufeff#include <cuda.h>\r\n/* one\r\n two */\r\n__global__ void crlf(int*\r\n x) {}\r\n",
        kernel("crlf", [ptr("x", "int *", "int")], line=4),
        id="bom-and-crlf",
    ),
]


@pytest.mark.parametrize("source, expected", CASES)
def test_reads_signature(source, expected):
    found = parse_kernels(source, path="k.cu")
    assert found[expected.name] == expected
    assert find_kernel(source, expected.name, path="k.cu") == expected


def test_only_global_functions_one_entry_per_kernel():
    source = (
        "__device__ void d(int);\n__host__ void h(int) {}\n__global__ void k(int);\n"
        "__global__ void k(int n) {}\nvoid plain(float* x) {}\n"
    )
    assert list(parse_kernels(source)) == ["k"]
    assert parse_kernels(source)["k"].params == (val("n", "int"),)


def test_unbalanced_code_outside_a_kernel_does_not_hide_later_kernels():
    source = "int f(int x;\n}\n)\n__global__ void k(int n) {}\n"
    assert list(parse_kernels(source)) == ["k"]


def test_empty_and_garbage_sources_have_no_kernels():
    assert parse_kernels("") == {}
    assert parse_kernels("}}}))) >>> __device__ ;;; é ∀ \x00") == {}


# ------------------------------------------------------------------------------ errors


def test_missing_kernel_lists_the_kernels_found():
    source = "__global__ void alpha(int);\n\n__global__ void beta(int) {}\n"
    with pytest.raises(ManifestError) as info:
        find_kernel(source, "gamma", path="ops.cu")
    err = info.value
    assert err.where == "ops.cu"
    assert "no __global__ function 'gamma' in ops.cu" in err.what
    assert "alpha (ops.cu:1), beta (ops.cu:3)" in err.what
    assert "gamma" in err.fix


def test_missing_kernel_suggests_a_close_name():
    with pytest.raises(ManifestError) as info:
        find_kernel("__global__ void simple_mul(int);", "simple_mull", path="k.cu")
    assert "kernels found: simple_mul (k.cu:1)" in info.value.what
    assert "did you mean 'simple_mul'?" in info.value.fix


def test_missing_kernel_in_a_source_without_kernels():
    with pytest.raises(ManifestError, match=r"kernels found: none"):
        find_kernel("__device__ void d(int);", "k")


@pytest.mark.parametrize(
    "source, where, what",
    [
        ("int x;\n/* never closed\n__global__ void k(int);", "k.cu:2", "never closed"),
        ('\nauto s = R"x(never )" closed\n__global__ void k(int);', "k.cu:2", "raw string literal is never"),
        ("\n__global__ void k(int n;\n", "k.cu:2", "unbalanced '('"),
        ("__global__ void k(int a,\n   );", "k.cu:1", "parameter 1 of kernel 'k': an empty parameter"),
        ("__global__ void k(int n, ...);", "k.cu:1", "variadic"),
        ("__global__ void k(float * int);", "k.cu:1", "'int' after the declarator"),
        ("__global__ void k(int 3);", "k.cu:1", "unexpected '3'"),
        ("\n\n__global__ int counter;", "k.cu:3", "without a readable name and parameter list"),
        ("template <typename T __global__ void k(T);", "k.cu:1", "'<' is never closed"),
    ],
)
def test_malformed_kernels_are_manifest_errors(source, where, what):
    with pytest.raises(ManifestError) as info:
        parse_kernels(source, path="k.cu")
    assert info.value.where == where
    assert what in info.value.what
    assert info.value.fix


def test_source_must_be_text():
    with pytest.raises(ManifestError, match="must be text"):
        parse_kernels(b"__global__ void k(int);")  # type: ignore[arg-type]


# -------------------------------------------------------------------------- properties

C_SOUP = st.sampled_from(
    [
        "__global__", "__device__", "void", "extern", '"C"', "{", "}", "(", ")", "[", "]", "<", ">",
        ">>", ",", ";", "*", "&", "=", "...", "::", "template", "typename", "namespace", "static",
        "k", "x", "T", "int", "const", "unsigned", "long", "float", "__restrict__", "__launch_bounds__",
        "256", "0x1F", "1'0", "'", '"', "/*", "*/", "//", "\\", "#", "#if 0", "#else", "#endif",
        "#define K __global__", '#define E extern "C" {', "K", "E", 'R"(', ")\"", "é", "\u00a0", "\ufeff",
    ]
)
SOUP_SEPARATOR = st.sampled_from(["", " ", "\n", "\r\n", "\\\n"])
ARBITRARY_SOURCE = st.one_of(
    st.text(max_size=300),
    st.lists(st.tuples(C_SOUP, SOUP_SEPARATOR), max_size=60).map(lambda ps: "".join(a + b for a, b in ps)),
)


@settings(max_examples=200, deadline=None)
@given(ARBITRARY_SOURCE)
def test_any_text_gives_kernels_or_a_manifest_error(source):
    try:
        kernels = parse_kernels(source, path="fuzz.cu")
    except ManifestError as err:
        assert err.where.startswith("fuzz.cu:") and err.fix
        return
    for name, sig in kernels.items():
        assert isinstance(sig, KernelSignature) and sig.name == name and sig.line >= 1
        assert all(isinstance(p, CParam) for p in sig.params)
    with pytest.raises(ManifestError, match="kernels found"):
        find_kernel(source, "not a c name", path="fuzz.cu")


# Words a generated name must not be: C++ keywords and what the parser treats as one.
RESERVED = frozenset(
    "alignas alignof asm auto bool break case catch char char8_t char16_t char32_t class const "
    "constexpr continue decltype default delete do double else enum explicit export extern false "
    "float for friend goto if inline int long mutable namespace new noexcept nullptr operator "
    "private protected public register restrict return short signed sizeof static struct switch "
    "template this throw true try typedef typename union unsigned using virtual void volatile "
    "wchar_t while".split()
)
NAMES = st.from_regex(r"[a-z][A-Za-z0-9_]{0,10}", fullmatch=True).filter(lambda s: s not in RESERVED)

# (spelling, normalized base type)
BASES = [
    ("float", "float"), ("double", "double"), ("int", "int"), ("unsigned", "unsigned int"),
    ("unsigned int", "unsigned int"), ("long long int", "long long"),
    ("unsigned long long", "unsigned long long"), ("long unsigned int", "unsigned long"),
    ("short int", "short"), ("signed char", "signed char"), ("char", "char"), ("bool", "bool"),
    ("int32_t", "int32_t"), ("std :: int64_t", "int64_t"), ("uint32_t", "uint32_t"),
    ("size_t", "size_t"), ("__half", "__half"), ("half", "half"), ("__nv_bfloat16", "__nv_bfloat16"),
    ("float4", "float4"), ("T", "T"),
]
# Separators between tokens: spaces, newlines, comments, line splices.
SEPARATORS = st.sampled_from(
    [" ", "\n", "\t ", " /* c */ ", "/* , ) */", "/*\n*/", " // c, )\n", "\\\n", "\r\n"]
)


@st.composite
def generated_param(draw):
    """(tokens, expected CParam) for a random pointer or scalar parameter."""
    spelling, base = draw(st.sampled_from(BASES))
    const = draw(st.sampled_from([None, "before", "after"]))
    volatile = draw(st.booleans()) and const != "after"
    depth = draw(st.sampled_from([0, 0, 1, 1, 1, 2]))
    ref = depth == 0 and draw(st.booleans()) and draw(st.booleans())
    named = draw(st.integers(0, 5)) > 0
    name = draw(NAMES) if named else ""
    toks = ["volatile"] * volatile + ["const"] * (const == "before") + spelling.split()
    toks += ["const"] * (const == "after")
    if depth == 0 and not ref and draw(st.booleans()):
        toks.insert(0, "__grid_constant__")
    level_const = []
    for _ in range(depth):
        level_const.append(draw(st.booleans()))
        toks += ["*"] + ["const"] * level_const[-1]
    if depth:
        toks += draw(st.sampled_from([[], ["__restrict__"], ["__restrict"], ["RESTRICT"] if named else []]))
    toks += ["&"] * ref + [name] * named
    if depth == 0 and draw(st.booleans()):
        toks += draw(st.sampled_from([["=", "3"], ["=", "1", "<", "2"], ["=", "(", "4", ")"]]))

    quals = ["const"] * (const is not None) + ["volatile"] * volatile
    text = " ".join(quals + [base])
    for c in level_const:
        text += ("*" if text.endswith("*") else " *") + "const" * c
    text += " &" * ref
    pointee_const = const is not None if depth == 1 else depth > 1 and level_const[-2]
    return toks, CParam(name, text, depth > 0, pointee_const, base)


@st.composite
def generated_source(draw):
    """(source, expected KernelSignature) for a random kernel among decoys."""
    name = draw(NAMES)
    params = draw(st.lists(generated_param(), max_size=6))
    linkage = draw(st.sampled_from(["none", "decl", "block", "macro"]))
    template = draw(st.booleans())
    bounds = draw(st.none() | st.lists(st.integers(1, 1024), min_size=1, max_size=2).map(tuple))
    mode = draw(st.sampled_from(["prototype", "definition", "both"]))

    head = ["template", "<", "typename", "T", ">"] * template
    head += draw(st.sampled_from([[], ["static"], ["KERNEL_API"]]))
    head += ["KAPI"] if linkage == "macro" else ["extern", '"C"'] * (linkage == "decl") + ["__global__"]
    lb = []
    if bounds:
        lb = ["__launch_bounds__", "("] + ",".join(map(str, bounds)).replace(",", " , ").split() + [")"]
    before_void = draw(st.booleans())
    head += lb * before_void + ["void"] + lb * (not before_void)
    param_toks = [t for i, (toks, _) in enumerate(params) for t in [","] * (i > 0) + toks]
    decl = head + [name, "("] + (param_toks or draw(st.sampled_from([[], ["void"]]))) + [")"]
    decls = {"prototype": [decl + [";"]], "definition": [decl + ["{", "}"]]}
    decls["both"] = decls["prototype"] + decls["definition"]
    kernel_toks = [t for d in decls[mode] for t in d]
    if linkage == "block":
        kernel_toks = ["extern", '"C"', "{"] + kernel_toks + ["}"]

    prelude = (
        '#define KAPI extern "C" \\\n   __global__\n'
        "#define DECOY(x) \\\n  __global__ void DECOY_KERNEL(x) {}\n"
        "/* __global__ void COMMENTED(int); */\n"
        'const char* s = "__global__ void QUOTED(int);";\n'
        "__device__ float helper(float* x) { return x[0]; }\n"
    )
    source, name_line = prelude, 0
    for tok, after in zip(kernel_toks, kernel_toks[1:] + [""]):
        if source[-1] != "\n":
            source += draw(SEPARATORS)
        if tok == name and after == "(":  # the last one: the definition's, when there is one
            name_line = source.count("\n") + 1
        source += tok
    sig = KernelSignature(name, tuple(p for _, p in params), linkage != "none", name_line)
    return source, sig


@settings(max_examples=200, deadline=None)
@given(generated_source())
def test_generated_signatures_round_trip(case):
    source, expected = case
    assert parse_kernels(source, path="gen.cu") == {expected.name: expected}
