from kfp.dsl import HTML, Markdown, Output

from gem_app.components.base import component


@component
def summary(ctx: str, teacher: dict, promoted: dict, workspace: str, report: Output[Markdown],
            report_html: Output[HTML]) -> str:
    """The run's summary table (teacher and student AUC/NE per surface, transfer lift,
    each gate decision and why), written to the workspace and MLflow (the parent run's
    description); closes the parent run."""
    import html

    from gem_app.stages.context import RunContext
    from gem_app.stages.summary import summary as run

    result = run(teacher, promoted, workspace, RunContext.loads(ctx))
    with open(report.path, "w") as f:
        f.write(result.markdown)
    rows = [line for line in result.markdown.splitlines() if line.startswith("|") and not line.startswith("|---")]
    cells = [[html.escape(c.strip()) for c in line.strip("|").split("|")] for line in rows]
    head = "".join(f"<th>{c}</th>" for c in cells[0]) if cells else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells[1:])
    title = html.escape(result.markdown.splitlines()[0].lstrip("# ")) if result.markdown else "GEM pipeline"
    with open(report_html.path, "w") as f:
        f.write(f"<html><body><h1>{title}</h1><table border='1'><tr>{head}</tr>{body}</table></body></html>\n")
    return result.markdown
