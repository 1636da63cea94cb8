"""Maps each top-level folder to a `pagoda.<folder>` package (see DESIGN.md, Layout)."""

from setuptools import find_namespace_packages, find_packages, setup

PARTS = {"runtime": "pagoda.runtime", "kernels": "pagoda.kernels", "operator": "pagoda.operator",
         "router": "pagoda.router"}

package_dir = {}
packages = []
for folder, name in PARTS.items():
    package_dir[name] = folder
    packages.append(name)
    # operator/ has no __init__.py on purpose: a regular package there would shadow the standard
    # library's `operator` for any `python -m` run from the repository root. It is a namespace
    # package, so its subpackages are found as such.
    find = find_namespace_packages if folder == "operator" else find_packages
    packages += [f"{name}.{sub}" for sub in find(folder, exclude=["__pycache__*"])]

setup(packages=packages, package_dir=package_dir)
