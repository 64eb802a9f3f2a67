from django.urls import path

from webapp.checkpoints import api, views

app_name = "checkpoints"
urlpatterns = [
    path("api/runs/<int:pk>/checkpoints/", api.RunCheckpointsView.as_view(), name="api-run-checkpoints"),
    path("api/projects/<int:pk>/aliases/", api.AliasesView.as_view(), name="api-aliases"),
    path("api/projects/<int:pk>/aliases/<str:name>/", api.AliasView.as_view(), name="api-alias"),
    path("api/projects/<int:pk>/evaluations/", api.EvaluationsView.as_view(), name="api-evaluations"),
    path("projects/<int:pk>/evaluations/", views.evaluation_table, name="evaluations"),
    path("projects/<int:pk>/aliases/<str:name>/download", views.alias_download, name="alias-download"),
    path("projects/<int:pk>/aliases/<str:name>/playground", views.alias_playground, name="alias-playground"),
]
