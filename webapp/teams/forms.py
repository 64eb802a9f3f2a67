"""Forms of the teams pages: raw input to names and roles, with what is wrong said next to it."""

from __future__ import annotations

from django import forms

from webapp.teams.models import Membership, Project


class TeamForm(forms.Form):
    name = forms.CharField(max_length=100)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices)


class ProjectForm(forms.ModelForm):
    class Meta:
        model = Project
        fields = ["name", "description"]
        help_texts = {"name": "Letters, digits, hyphens and underscores."}


class InvitationForm(forms.Form):
    invitee = forms.CharField(
        max_length=254, required=False, label="For (username or email)",
        help_text="Only this person may use the link (and finds it on their Teams page); empty: whoever has the link.",
    )
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)
