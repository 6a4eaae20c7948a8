"""The `orchestrate` command line.  Thin: parse, call orchestrate.*, print.

Every error a user can cause is an OrchestrateError: it is printed as one
line naming the file, node or option, and the exit code is 2.
"""

from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path

import click

from orchestrate.errors import OrchestrateError

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


def _fail(message: str, code: int) -> None:
    click.echo(f"orchestrate: error: {message}", err=True)
    sys.exit(code)


def reports_errors(fn):
    """Turn OrchestrateError into one line and exit code 2; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OrchestrateError as e:
            _fail(str(e), EXIT_USER_ERROR)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as e:  # noqa: BLE001 - a bug: say so in one line
            if click.get_current_context().find_root().params.get("debug"):
                traceback.print_exc()
            _fail(
                f"internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)",
                EXIT_INTERNAL_ERROR,
            )

    return wrapper


class ShapeParam(click.ParamType):
    name = "NAME=DIMS"

    def convert(self, value, param, ctx):
        from orchestrate.errors import InputError
        from orchestrate.frontend import parse_shape

        try:
            return parse_shape(value)
        except InputError as e:
            self.fail(str(e), param, ctx)


def shape_option(fn):
    return click.option(
        "--shape",
        "shapes",
        type=ShapeParam(),
        multiple=True,
        help="Bind a dynamic input shape, e.g. --shape input_ids=1x128 (repeatable).",
    )(fn)


def _shapes(pairs) -> dict[str, tuple[int, ...]]:
    from orchestrate.errors import InputError

    out: dict[str, tuple[int, ...]] = {}
    for name, dims in pairs:
        if name in out and out[name] != dims:
            raise InputError(f"--shape {name}: given twice with different dimensions")
        out[name] = dims
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks of internal errors.")
@click.version_option(package_name="orchestrate")
def main(debug: bool) -> None:
    """orchestrate: ONNX in, optimally fused Triton kernels out.

    \b
    Stages, each a command:
      inspect    op counts before and after operator fission
      decompose  write the primitive graph as a plain ONNX model
    """


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the primitive ONNX model.")  # fmt: skip
@shape_option
@reports_errors
def decompose(model: Path, output: Path, shapes) -> None:
    """Split every ONNX operator of MODEL into primitives; write them as ONNX."""
    from orchestrate import pipeline

    pipeline.check_output_path(output)
    graph = pipeline.fission_file(model, _shapes(shapes))
    pipeline.write_primitive_onnx(graph, output, name=model.stem)
    click.echo(
        f"wrote {output}: {len(graph.nodes)} primitives "
        f"({len(graph.inputs)} inputs, {len(graph.outputs)} outputs, "
        f"{len(graph.constants)} constants)"
    )


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@shape_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@reports_errors
def inspect(model: Path, shapes, as_json: bool) -> None:
    """Op types and tensor sizes of MODEL, before and after operator fission."""
    from orchestrate import pipeline
    from orchestrate.summary import format_inspection, inspection

    onnx_model = pipeline.load(model)
    graph = pipeline.fission_model(onnx_model, _shapes(shapes), str(model))
    info = inspection(onnx_model, graph, source=str(model))
    if as_json:
        import json

        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(format_inspection(info))


if __name__ == "__main__":
    main()
