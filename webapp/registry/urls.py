from django.urls import path

from webapp.registry import views

app_name = "registry"
urlpatterns = [
    path("projects/<int:pk>/registry/", views.project_registry, name="project"),
    path("projects/<int:pk>/datasets/upload/", views.dataset_upload, name="dataset_upload"),
    path("projects/<int:pk>/datasets/upload/<str:token>/", views.dataset_map, name="dataset_map"),
    path("projects/<int:pk>/datasets/upload/<str:token>/discard/", views.dataset_discard, name="dataset_discard"),
    path("projects/<int:pk>/agents/new/", views.agent_create, name="agent_create"),
    path("datasets/<int:pk>/", views.dataset_detail, name="dataset_detail"),
    path("registry/<str:kind>/<int:pk>/delete/", views.entry_delete, name="entry_delete"),
]
