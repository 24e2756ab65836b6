import os
import re

from setuptools import find_namespace_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def for_pypi(readme: str) -> str:
    """The README as PyPI's long description: PyPI resolves no relative link, so a link
    into the repository (docs/, examples/) keeps its text and loses its target."""
    return re.sub(r"\[([^\]]+)\]\((?!https?://)[^)]+\)", r"\1", readme)


with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    README = for_pypi(f.read())


def requirements(name: str) -> list:
    """The pins of a requirements file (comments and blank lines left out)."""
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


# Build metadata (the .egg-info) goes under build/, not beside metaflow_extensions/:
# on sys.path (an editable install, or `python -m` from the repository) it reads as a
# second copy of this distribution, and Metaflow before 2.19 then skips the extension
# as a duplicate ("cannot import name 'torchrun' from 'metaflow'").
os.makedirs("build", exist_ok=True)

with open(os.path.join(HERE, "metaflow_extensions", "torchrun", "plugins", "torchrun", "base", "version.py")) as f:
    VERSION = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

setup(
    name="metaflow-torchrun",
    version=VERSION,
    description="A Metaflow @torchrun decorator: PyTorch distributed across the nodes "
    "of a @parallel step, locally, on Kubernetes and on AWS Batch.",
    long_description=README,
    long_description_content_type="text/markdown",
    # An SPDX expression only: a License classifier beside it is deprecated (setuptools 77+).
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.11",
    # The namespace root is listed and mapped from "" so that a plain `pip install -e .`
    # adds the repository to sys.path (a .pth file), where Metaflow finds
    # metaflow_extensions/; setuptools' default import-hook editable install hides it.
    packages=find_namespace_packages(include=["metaflow_extensions", "metaflow_extensions.*"]),
    package_dir={"": "."},
    package_data={"metaflow_extensions.torchrun.plugins.torchrun": ["py.typed"]},
    options={"egg_info": {"egg_base": "build"}},
    # setproctitle: a rank forked from the warm process shows its own command to ps (host/title.py).
    install_requires=["metaflow>=2.12", "setproctitle>=1.3"],
    extras_require={
        "torch": ["torch>=2.11"],
        # @checkpoint / @model (docs/resume.md): resume a failed gang from its last save.
        "checkpoint": ["metaflow-checkpoint>=0.2.14"],
        # What HF's Trainer needs under @torchrun, at the tested versions (requirements-hf.txt, pinned).
        "hf": requirements("requirements-hf.txt"),
        # What `make docs` installs to build the site (requirements-docs.txt, pinned).
        "docs": requirements("requirements-docs.txt"),
    },
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
        "Typing :: Typed",
    ],
    keywords=["metaflow", "pytorch", "torchrun", "distributed", "kubernetes", "aws-batch"],
)
