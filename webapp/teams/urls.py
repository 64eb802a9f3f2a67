from django.urls import path

from webapp.teams import views

app_name = "teams"
urlpatterns = [
    path("teams/", views.my_teams, name="mine"),
    path("share/<str:token>/", views.shared_run, name="shared_run"),
    path("runs/<int:pk>/share/", views.create_share, name="create_share"),
    path("share-links/<int:pk>/revoke/", views.revoke_share, name="revoke_share"),
]
