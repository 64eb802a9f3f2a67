"""The run pages' addresses, named ``runs:...`` as they always were (``webapp.dashboard.pages``)."""

from django.urls import path

from webapp.dashboard import pages, views
from webapp.runs import downloads

app_name = "runs"
urlpatterns = [
    path("", pages.run_list, name="list"),
    path("runs/new/", pages.run_create, name="create"),
    path("runs/<int:pk>/", pages.run_detail, name="detail"),
    path("runs/<int:pk>/episodes/<int:episode_id>/", pages.episode_detail, name="episode"),
    path("runs/<int:pk>/cancel/", pages.run_cancel, name="cancel"),
    path("runs/<int:pk>/edit/", pages.run_edit, name="edit"),
    path("runs/<int:pk>/delete/", pages.run_delete, name="delete"),
    path("runs/<int:pk>/updates.json", pages.run_updates, name="updates"),
    path("runs/<int:pk>/waiting.json", pages.run_waiting, name="waiting"),
    path("runs/live.json", pages.run_list_live, name="list_live"),
    path("runs/table/", pages.run_table_columns, name="table_columns"),
    path("runs/<int:pk>/config.yaml", downloads.config_download, name="config_yaml"),
    path("runs/<int:pk>/metrics.csv", views.metrics_csv, name="metrics_csv"),
    path("runs/<int:pk>/models/<str:name>.tar.gz", downloads.model_archive, name="model_archive"),
    path("runs/<int:pk>/files/<path:name>", downloads.stored_file, name="stored_file"),
    path("share/<str:token>/", pages.shared_run, name="shared_run"),
    path("runs/<int:pk>/share/", pages.create_share, name="create_share"),
    path("share-links/<int:pk>/revoke/", pages.revoke_share, name="revoke_share"),
]
