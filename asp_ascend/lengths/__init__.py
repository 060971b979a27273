"""lengths"""
