"""numpy references for `kitdispatch test`: one function per callable, same arguments."""


def simple_mul(lhs, rhs):
    return lhs * rhs


def simple_mul_inplace(lhs, rhs):
    return rhs * lhs


def mixed_invocation(lhs, rhs):
    product = lhs * rhs
    return (product + rhs) * product
