from django import template

from webapp.integrations.tracking import external_links

register = template.Library()


@register.inclusion_tag("integrations/run_links.html")
def tracking_links(run):
    """The run's external tracker runs (W&B, MLflow, TensorBoard), for the run page."""
    return {"links": external_links(run)}
