from django.urls import path

from webapp.runs import views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="list"),
    path("runs/new/", views.run_create, name="create"),
    path("runs/<int:pk>/", views.run_detail, name="detail"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="cancel"),
    path("runs/<int:pk>/edit/", views.run_edit, name="edit"),
    path("runs/<int:pk>/delete/", views.run_delete, name="delete"),
    path("runs/<int:pk>/updates.json", views.run_updates, name="updates"),
]
