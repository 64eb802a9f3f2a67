from django.urls import path

from webapp.runs import downloads, views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="list"),
    path("runs/new/", views.run_create, name="create"),
    path("runs/<int:pk>/", views.run_detail, name="detail"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="cancel"),
    path("runs/<int:pk>/edit/", views.run_edit, name="edit"),
    path("runs/<int:pk>/delete/", views.run_delete, name="delete"),
    path("runs/<int:pk>/updates.json", views.run_updates, name="updates"),
    path("runs/<int:pk>/waiting.json", views.run_waiting, name="waiting"),
    path("runs/live.json", views.run_list_live, name="list_live"),
    path("runs/table/", views.run_table_columns, name="table_columns"),
    path("runs/<int:pk>/config.yaml", downloads.config_download, name="config_yaml"),
    path("runs/<int:pk>/metrics.csv", downloads.metrics_csv, name="metrics_csv"),
    path("runs/<int:pk>/models/<str:name>.tar.gz", downloads.model_archive, name="model_archive"),
    path("runs/<int:pk>/files/<path:name>", downloads.stored_file, name="stored_file"),
]
