from django.urls import path

from webapp.teams import views

app_name = "teams"
urlpatterns = [
    path("teams/", views.my_teams, name="mine"),
    path("teams/new/", views.create_team, name="create"),
    path("teams/<slug:slug>/", views.team_detail, name="detail"),
    path("teams/<slug:slug>/members/<int:user_id>/role/", views.change_role, name="change_role"),
    path("teams/<slug:slug>/members/<int:user_id>/remove/", views.remove_member, name="remove_member"),
    path("teams/<slug:slug>/projects/", views.add_project, name="add_project"),
    path("teams/<slug:slug>/invitations/", views.create_invitation, name="create_invitation"),
    path("invitations/<int:pk>/revoke/", views.revoke_invitation, name="revoke_invitation"),
    path("invite/<str:token>/", views.accept_invitation, name="accept_invitation"),
    path("invitations/<int:pk>/answer/", views.answer_invitation, name="answer_invitation"),
    path("signup/", views.signup, name="signup"),
]
