from setuptools import find_namespace_packages, setup

setup(
    name="metaflow-torchrun",
    version="0.1.0",
    description="A Metaflow @torchrun decorator: PyTorch distributed across the nodes "
    "of a @parallel step, locally, on Kubernetes and on AWS Batch.",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.8",
    packages=find_namespace_packages(include=["metaflow_extensions.*"]),
    install_requires=["metaflow>=2.12"],
    extras_require={"torch": ["torch>=2.1"]},
)
