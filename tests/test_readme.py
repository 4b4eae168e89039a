"""What the README tells people to type must be what the kit does."""

import re
from pathlib import Path

from kitdispatch.compile.archs import Arch
from kitdispatch.iree.tools import iree_flags

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_the_hand_written_iree_compile_command_has_every_flag_the_kit_passes():
    block = re.search(r"To compile a generated `NAME.mlir` yourself.*?```sh\n(.*?)```", README, re.S).group(1)
    for flag in iree_flags(Arch.parse("sm_80")):
        assert flag in block, flag
    assert "--iree-hal-executable-object-search-path=out" in block


def test_the_quick_start_and_the_api_come_before_the_manifest_reference():
    order = [README.index(h) for h in ("## Quick start", "## The Python API", "## Describing kernels")]
    assert order == sorted(order)


def test_install_lines_name_the_checkout_or_a_wheel_not_an_index():
    """kitdispatch is on no package index: every install line takes the checkout or a wheel
    built from it, named as `pip wheel .` names it."""
    from kitdispatch.describe.manifest import tomllib  # tomli before Python 3.11

    assert not re.findall(r"pip install[^\n`]*?(?<![\w./-])'?kitdispatch\b", README)
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    wheels = set(re.findall(r"dist/kitdispatch-([\w.*]+)-py3-none-any\.whl", README))
    assert wheels and wheels <= {project["version"]}, wheels
    assert "pip install -e '.[build]'" in README and "pip wheel . --no-deps -w dist" in README
